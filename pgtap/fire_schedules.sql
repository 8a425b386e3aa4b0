-- runrow.fire_schedules: a due tick enqueues its template once, however often and by whom it
-- is fired; next_fire_at moves past now in the same transaction; missed ticks follow the
-- catch-up policy (tested through _fire_schedules, the same body at a chosen instant, since
-- pgTAP cannot move now()); a tick whose template cannot be enqueued is recorded and never
-- retried, and does not stop the others. Two sessions racing on one tick: tests/test_schedules.py.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(49);
SELECT pg_temp.drain_queue();
DELETE FROM runrow.schedule;  -- only this file's schedules fire

SELECT has_function('runrow', 'fire_schedules', ARRAY['integer'], 'fire_schedules(max_schedules) exists');
SELECT is_definer('runrow', 'fire_schedules', ARRAY['integer'], 'fire_schedules is SECURITY DEFINER');
SELECT ok(length(obj_description('runrow.fire_schedules(integer)'::regprocedure, 'pg_proc')) > 200,
    'fire_schedules has a COMMENT stating its contract');

-- Nothing due: nothing happens.
SELECT runrow.create_schedule('report', '*/10 * * * *', '"write the report"', 'model-s', user_id => 'ops',
    system_prompt => 'be brief', tools => '[{"name": "t", "input_schema": {"type": "object"}}]', metadata => '{"k": 1}', max_attempts => 2,
    priority => 5, concurrency_key => 'reports') AS report \gset
SELECT pg_temp.fingerprint() AS before \gset
SELECT is(runrow.fire_schedules(), 0, 'no tick is due yet: 0');
SELECT is(pg_temp.fingerprint(), :'before', 'and nothing is written');

-- A due tick (set-up: the owner moves the first tick into the past, as if it had been missed).
UPDATE runrow.schedule SET next_fire_at = date_trunc('hour', now()) - interval '1 hour' WHERE id = :'report';
SELECT runrow._cron_prev(runrow._cron_parse('*/10 * * * *'), now(), NULL) AS tick \gset
SELECT is(runrow.fire_schedules(), 1, 'a due tick enqueues one run');
SELECT last_run_id AS run FROM runrow.schedule WHERE id = :'report' \gset
SELECT is((SELECT (status, model, user_id, max_attempts, metadata, priority, fairness_key, concurrency_key,
            idempotency_key)::text
        FROM runrow.agent_run WHERE id = :'run'),
    ('queued', 'model-s', 'ops', 2, '{"k": 1}'::jsonb, 5, 'ops', 'reports',
     runrow._schedule_tick_key(:'report', :'tick'))::text,
    'the run is the template, keyed by schedule and tick');
SELECT is((SELECT (m.content, p.system_prompt, p.tools)::text FROM runrow.agent_run AS a
        JOIN runrow.message AS m ON m.id = a.user_message_id JOIN runrow.prompt AS p ON p.id = a.prompt_id
        WHERE a.id = :'run'),
    ('"write the report"'::jsonb, 'be brief', '[{"name": "t", "input_schema": {"type": "object"}}]'::jsonb)::text, 'with its content and pinned prompt');
SELECT is((SELECT conversation_id FROM runrow.agent_run WHERE id = :'run'),
    runrow._schedule_conversation(:'report', :'tick'), 'in a new conversation derived from the tick');
SELECT is(runrow._schedule_tick_key(:'report', :'tick'),
    'runrow-schedule:' || :'report' || ':' || to_char(:'tick'::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI"Z"'),
    'the key names the schedule and the tick in UTC');
SELECT is((SELECT (next_fire_at, last_tick_at, last_error)::text FROM runrow.schedule WHERE id = :'report'),
    (runrow._cron_next(runrow._cron_parse('*/10 * * * *'), now()), :'tick'::timestamptz, NULL::text)::text,
    'catch_up latest: only the most recent missed tick ran; next_fire_at is the first tick after now');
SELECT is((SELECT (last_run_id, last_run_status)::text FROM runrow.schedules WHERE name = 'report'),
    (:'run'::uuid, 'queued')::text, 'runrow.schedules shows the last run and its status');

-- Fired again in the same instant (another reaper, the same pass twice): nothing more.
SELECT pg_temp.fingerprint() AS before \gset
SELECT is(runrow.fire_schedules(), 0, 'firing again at the same instant enqueues nothing');
SELECT is(pg_temp.fingerprint(), :'before', 'and writes nothing');
-- The key is the second guarantee: even with next_fire_at rewound to the fired tick, the
-- tick replays its run instead of enqueueing another.
UPDATE runrow.schedule SET next_fire_at = :'tick' WHERE id = :'report';
SELECT is(runrow.fire_schedules(), 0, 'a rewound next_fire_at enqueues no second run for the tick');
SELECT is((SELECT count(*)::int FROM runrow.agent_run WHERE idempotency_key = runrow._schedule_tick_key(:'report', :'tick')),
    1, 'one run for the tick');
SELECT is((SELECT (last_run_id, last_error)::text FROM runrow.schedule WHERE id = :'report'), (:'run'::uuid, NULL::text)::text,
    'the schedule still names that run');

-- Catch-up after an outage, with a controlled clock: the next tick was 2030-01-01 00:00 and
-- the reaper comes back at 01:05 (7 ticks missed: 00:00, 00:10, ..., 01:00).
DELETE FROM runrow.schedule;
SELECT runrow.create_schedule('latest', '*/10 * * * *', '"l"', 'm') AS latest \gset
SELECT runrow.create_schedule('each', '*/10 * * * *', '"e"', 'm', catch_up => 'each') AS each \gset
SELECT runrow.create_schedule('each3', '*/10 * * * *', '"e3"', 'm', catch_up => 'each', max_catch_up => 3) AS each3 \gset
UPDATE runrow.schedule SET next_fire_at = '2030-01-01 00:00Z';
CREATE FUNCTION pg_temp.ticks(schedule uuid) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(right(a.idempotency_key, 6) ORDER BY a.enqueue_seq), '{}') FROM runrow.agent_run AS a
    WHERE a.idempotency_key LIKE 'runrow-schedule:' || schedule || ':%'
$$;
SELECT is(runrow._fire_schedules('2030-01-01 01:05:30Z', 100), 1 + 7 + 3, '11 runs in all');
SELECT is(pg_temp.ticks(:'latest'), ARRAY['01:00Z'], 'latest: only the most recent missed tick');
SELECT is(pg_temp.ticks(:'each'), ARRAY['00:00Z', '00:10Z', '00:20Z', '00:30Z', '00:40Z', '00:50Z', '01:00Z'],
    'each: every missed tick, oldest first');
SELECT is(pg_temp.ticks(:'each3'), ARRAY['00:40Z', '00:50Z', '01:00Z'], 'each with max_catch_up 3: the 3 most recent');
SELECT is((SELECT array_agg(DISTINCT next_fire_at) FROM runrow.schedule), ARRAY['2030-01-01 01:10Z'::timestamptz],
    'every schedule''s next tick is the first after the instant fired');
SELECT is((SELECT array_agg(DISTINCT last_tick_at) FROM runrow.schedule), ARRAY['2030-01-01 01:00Z'::timestamptz],
    'and its last tick the most recent');
SELECT is(runrow._fire_schedules('2030-01-01 01:09Z', 100), 0, 'nothing more before 01:10');
SELECT is(runrow._fire_schedules('2030-01-01 01:10Z', 100), 3, 'at 01:10 each schedule fires its tick once');
SELECT is(pg_temp.ticks(:'each3'), ARRAY['00:40Z', '00:50Z', '01:00Z', '01:10Z'], 'the next tick follows on');
-- max_schedules bounds one pass; the oldest due go first, the next pass takes the rest.
UPDATE runrow.schedule SET next_fire_at = '2030-01-01 01:30Z' WHERE id = :'latest';
SELECT is(runrow._fire_schedules('2030-01-01 01:30Z', 2), 4,
    'max_schedules 2: the two due longest fire (each their 01:20 and 01:30 ticks)');
SELECT is((SELECT array_agg(name ORDER BY name) FROM runrow.schedule WHERE next_fire_at <= '2030-01-01 01:30Z'),
    ARRAY['latest'], 'the one due last waits for the next pass');
SELECT is(runrow._fire_schedules('2030-01-01 01:30Z', 2), 1, 'which fires it');

-- A schedule a pass left due because it was busy (passed_over_at: that pass's instant) goes
-- behind every schedule due then, however old its tick (migration 0079; the busy passes
-- themselves, with a second session holding the conversations: tests/test_schedules.py).
DELETE FROM runrow.schedule;
SELECT runrow.create_schedule('passed-over', '*/10 * * * *', '"p"', 'm') AS passed \gset
SELECT runrow.create_schedule('later-1', '*/10 * * * *', '"l1"', 'm');
SELECT runrow.create_schedule('later-2', '*/10 * * * *', '"l2"', 'm');
UPDATE runrow.schedule SET next_fire_at = CASE name WHEN 'passed-over' THEN '2030-01-01 00:00Z'::timestamptz
    WHEN 'later-1' THEN '2030-01-01 00:10Z' ELSE '2030-01-01 00:20Z' END;
UPDATE runrow.schedule SET passed_over_at = '2030-01-01 00:25Z' WHERE id = :'passed';
SELECT is(runrow._fire_schedules('2030-01-01 00:30Z', 2), 2, 'max_schedules 2: two fire');
SELECT is((SELECT array_agg(name) FROM runrow.schedule WHERE next_fire_at <= '2030-01-01 00:30Z'),
    ARRAY['passed-over'], 'the passed-over one, though due longest, waits behind the two due after it');
SELECT is(runrow._fire_schedules('2030-01-01 00:30Z', 2), 1, 'the next pass fires it');
SELECT is((SELECT (passed_over_at, next_fire_at)::text FROM runrow.schedule WHERE id = :'passed'),
    (NULL::timestamptz, '2030-01-01 00:40Z'::timestamptz)::text, 'moved on, it is no longer marked passed over');

-- A fixed conversation: each tick is the next turn of it.
DELETE FROM runrow.schedule;
SELECT pg_temp.drain_queue();
SELECT gen_random_uuid() AS conv \gset
SELECT runrow.create_schedule('chat', '0 * * * *', '"ping"', 'm', conversation_id => :'conv') AS chat \gset
SELECT runrow.create_schedule('no-overlap', '0 * * * *', '"ping"', 'm', conversation_id => :'conv',
    if_active => 'reject') AS reject \gset
UPDATE runrow.schedule SET next_fire_at = '2030-01-01 00:00Z' WHERE id = :'chat';
UPDATE runrow.schedule SET next_fire_at = '2030-01-01 00:00Z' WHERE id = :'reject';
SELECT is(runrow._fire_schedules('2030-01-01 00:00Z', 100), 1,
    'two schedules into one conversation: the first tick enqueues, the reject one finds it active');
SELECT is((SELECT count(*)::int FROM runrow.agent_run WHERE conversation_id = :'conv'), 1, 'one turn');
SELECT is((SELECT (last_run_id IS NULL, next_fire_at, last_error LIKE 'tick 2030-01-01T00:00Z enqueued nothing: '
        || 'conversation % already has an active run (if_active = reject) (SQLSTATE 55000)')::text
        FROM runrow.schedule WHERE id = :'reject'),
    (true, '2030-01-01 01:00Z'::timestamptz, true)::text,
    'the rejected tick is recorded in last_error and skipped for good: next_fire_at moved on');
SELECT is(runrow._fire_schedules('2030-01-01 00:00Z', 100), 0, 'it is not retried');
SELECT is(runrow._fire_schedules('2030-01-01 01:00Z', 100), 1, 'at the next tick, the enqueue one queues a turn behind');
SELECT is((SELECT array_agg(status ORDER BY enqueue_seq) FROM runrow.agent_run WHERE conversation_id = :'conv'),
    ARRAY['queued', 'queued'], 'two turns of the conversation, in order');

-- A conversation another user took after the schedule was made: the tick fails with 42501,
-- is recorded, and the other due schedules still fire in the same pass.
DELETE FROM runrow.schedule;
SELECT gen_random_uuid() AS taken \gset
SELECT runrow.create_schedule('alice', '0 * * * *', '"x"', 'm', user_id => 'alice', conversation_id => :'taken') AS alice \gset
SELECT runrow.create_schedule('other', '0 * * * *', '"x"', 'm') AS other \gset
SELECT run_id FROM runrow.enqueue_run(:'taken', '"mine now"', 'm', user_id => 'bob');
UPDATE runrow.schedule SET next_fire_at = '2030-01-01 00:00Z';
SELECT is(runrow._fire_schedules('2030-01-01 00:00Z', 100), 1, 'the other schedule fires');
SELECT is((SELECT (next_fire_at, last_error LIKE '%belongs to another user (SQLSTATE 42501)')::text
        FROM runrow.schedule WHERE id = :'alice'),
    ('2030-01-01 01:00Z'::timestamptz, true)::text, 'alice''s tick is recorded as 42501 and skipped');

-- A cron written around create_schedule and its trigger that does not parse (before migration
-- 0067 nothing refused one): every pass raised on it, the oldest due, and nothing fired anywhere.
-- Now it stops its own schedule, and the others fire.
DELETE FROM runrow.schedule;
SELECT runrow.create_schedule('edited', '0 9 * * mon-fri', '"x"', 'm') AS edited \gset
SELECT runrow.create_schedule('good', '0 * * * *', '"x"', 'm') AS good \gset
ALTER TABLE runrow.schedule DISABLE TRIGGER schedule_cron_parses;
UPDATE runrow.schedule SET cron = '0 9 * * mon-fry' WHERE id = :'edited';
ALTER TABLE runrow.schedule ENABLE TRIGGER schedule_cron_parses;
UPDATE runrow.schedule SET next_fire_at = '2030-01-01 00:00Z'::timestamptz - make_interval(mins => CASE WHEN id = :'edited' THEN 1 ELSE 0 END);
SELECT is(runrow._fire_schedules('2030-01-01 00:00Z', 100), 1, 'the good schedule fires past the broken one');
SELECT is((SELECT (next_fire_at, last_error LIKE 'cron does not parse, so the schedule stopped: cron "0 9 * * mon-fry"%')::text
        FROM runrow.schedule WHERE id = :'edited'),
    ('infinity'::timestamptz, true)::text, 'the broken one stops (next_fire_at infinity) and says why');
SELECT is(runrow._fire_schedules('2030-01-01 00:00Z', 100), 0, 'and is not taken again');

-- Bad input: 22023/22004 naming max_schedules, nothing written.
SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok($$SELECT runrow.fire_schedules(0)$$, '22023', 'max_schedules must be between 1 and 10000, got 0',
    'max_schedules 0');
SELECT throws_ok($$SELECT runrow.fire_schedules(NULL)$$, '22004', 'max_schedules must not be NULL', 'NULL max_schedules');
SELECT is(pg_temp.fingerprint(), :'before', 'nothing written');

-- Roles: the worker fires (its reaper pass); the client and the auditor cannot.
SELECT lives_ok($$SELECT pg_temp.as_role('runrow_worker', 'SELECT runrow.fire_schedules()')$$, 'runrow_worker may fire');
SELECT throws_ok($$SELECT pg_temp.as_role('runrow_client', 'SELECT runrow.fire_schedules()')$$, '42501', NULL,
    'runrow_client may not');

SELECT * FROM finish();
ROLLBACK;
