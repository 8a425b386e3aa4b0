-- runrow.fire_schedules_pass: fire_schedules' pass, reporting the runs it created and the
-- schedules it moved on. A pass of max_schedules schedules whose ticks enqueued nothing
-- (if_active = reject on a conversation with an active run) created 0 runs but used its whole
-- budget: moved_on says so, and the reaper goes again (tests/test_schedules.py, fire_once).
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(12);
SELECT pg_temp.drain_queue();
DELETE FROM runrow.schedule;  -- only this file's schedules fire

SELECT has_function('runrow', 'fire_schedules_pass', ARRAY['integer'], 'fire_schedules_pass(max_schedules) exists');
SELECT is_definer('runrow', 'fire_schedules_pass', ARRAY['integer'], 'fire_schedules_pass is SECURITY DEFINER');
SELECT ok(length(obj_description('runrow.fire_schedules_pass(integer)'::regprocedure, 'pg_proc')) > 200,
    'fire_schedules_pass has a COMMENT stating its contract');

-- Nothing due: an empty pass.
SELECT is((SELECT (enqueued, moved_on)::text FROM runrow.fire_schedules_pass()), (0, 0)::text,
    'nothing due: 0 enqueued, 0 moved on');

-- Three reject schedules into a conversation with an active run, due before a healthy one
-- (set-up: the owner moves their first ticks into the past, oldest first).
SELECT gen_random_uuid() AS conv \gset
SELECT run_id AS active FROM runrow.enqueue_run(:'conv', '"a user turn"', 'm') \gset
SELECT runrow.create_schedule('reject-' || i, '* * * * *', '"tick"', 'm', conversation_id => :'conv',
    if_active => 'reject')
FROM generate_series(1, 3) AS i;
SELECT runrow.create_schedule('healthy', '* * * * *', '"tick"', 'm') AS healthy \gset
UPDATE runrow.schedule SET next_fire_at = now() - interval '1 hour'
    - CASE WHEN name = 'healthy' THEN interval '0' ELSE interval '1 minute' END;

SELECT is((SELECT (enqueued, moved_on)::text FROM runrow.fire_schedules_pass(3)), (0, 3)::text,
    'a pass of three reject ticks enqueues nothing but moves on its whole budget');
SELECT is((SELECT count(*)::int FROM runrow.schedule WHERE name LIKE 'reject-%' AND next_fire_at > now()
        AND last_error LIKE '%if_active = reject%'), 3, 'each is moved on, its error kept');
SELECT is((SELECT (enqueued, moved_on)::text FROM runrow.fire_schedules_pass(3)), (1, 1)::text,
    'the next pass fires the healthy one behind them');
SELECT is((SELECT count(*)::int FROM runrow.agent_run
        WHERE idempotency_key LIKE 'runrow-schedule:' || :'healthy' || ':%'), 1, 'one run of the healthy schedule');
SELECT is((SELECT (enqueued, moved_on)::text FROM runrow.fire_schedules_pass(3)), (0, 0)::text,
    'then nothing is left: 0, 0');

-- Bad input: 22023/22004 naming max_schedules, nothing written.
SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok($$SELECT * FROM runrow.fire_schedules_pass(0)$$, '22023',
    'max_schedules must be between 1 and 10000, got 0', 'max_schedules 0');
SELECT throws_ok($$SELECT * FROM runrow.fire_schedules_pass(NULL)$$, '22004', 'max_schedules must not be NULL',
    'NULL max_schedules');
SELECT is(pg_temp.fingerprint(), :'before', 'nothing written');

SELECT * FROM finish();
ROLLBACK;
