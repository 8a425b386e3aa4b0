-- A schedule whose next tick was counted by a database clock that ran ahead (a wrong NTP step),
-- after the clock is set back: the firing pass moves the tick back to the first one after now
-- and says so in last_error (_rewind_schedules, migration 0103). It stayed silent for as long as
-- the clock had been ahead, with no last_error. The clock having run ahead is simulated by the
-- owner writing the schedule's timestamps as a pass at that future instant would have.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(21);
SELECT pg_temp.drain_queue();
DELETE FROM runrow.schedule;  -- only this file's schedules fire

CREATE FUNCTION pg_temp.first_tick(cron text, after timestamptz) RETURNS timestamptz LANGUAGE sql AS $$
    SELECT runrow._cron_next(runrow._cron_parse(cron), after)
$$;
-- What a pass at `ahead` (the clock that ran ahead) left on the row.
CREATE FUNCTION pg_temp.written_ahead(sched uuid, ahead interval) RETURNS void LANGUAGE sql AS $$
    UPDATE runrow.schedule SET
        next_fire_at = pg_temp.first_tick(cron, now() + ahead),
        last_tick_at = runrow._cron_prev(runrow._cron_parse(cron), now() + ahead, NULL),
        updated_at = now() + ahead
    WHERE id = sched
$$;

SELECT has_function('runrow', '_rewind_schedules', ARRAY['timestamptz', 'integer'], '_rewind_schedules exists');
SELECT isnt(obj_description(to_regprocedure('runrow._rewind_schedules(timestamptz, integer)'), 'pg_proc'), NULL,
    'it has a COMMENT stating its contract');

-- Nothing written ahead: a pass writes nothing.
SELECT runrow.create_schedule('ten', '*/10 * * * *', '"t"', 'm') AS ten \gset
SELECT pg_temp.fingerprint() AS before \gset
SELECT is((SELECT (enqueued, moved_on)::text FROM runrow.fire_schedules_pass()), (0, 0)::text,
    'nothing due, nothing written ahead: (0, 0)');
SELECT is(pg_temp.fingerprint(), :'before', 'and nothing is written');

-- The clock ran a day ahead, a pass moved the tick a day on, the clock was set back.
SELECT pg_temp.written_ahead(:'ten', interval '1 day');
SELECT is((SELECT (enqueued, moved_on)::text FROM runrow.fire_schedules_pass()), (0, 1)::text,
    'the pass moves the schedule back (moved_on 1), enqueueing nothing');
SELECT is((SELECT next_fire_at FROM runrow.schedule WHERE id = :'ten'), pg_temp.first_tick('*/10 * * * *', now()),
    'next_fire_at is the first tick after now, not a day later');
SELECT matches((SELECT last_error FROM runrow.schedule WHERE id = :'ten'),
    '^the database clock was set back: this schedule was written at .*, 1 day ahead of .*; moved back to ',
    'last_error says so');
SELECT is((SELECT updated_at FROM runrow.schedule WHERE id = :'ten'), now(), 'updated_at is now()');
SELECT pg_temp.fingerprint() AS before \gset
SELECT is((SELECT (enqueued, moved_on)::text FROM runrow.fire_schedules_pass()), (0, 0)::text,
    'taken once: the next pass finds nothing');
SELECT is(pg_temp.fingerprint(), :'before', 'and writes nothing');
SELECT is(runrow._fire_schedules(pg_temp.first_tick('*/10 * * * *', now()) + interval '30 seconds', 100), 1,
    'at its next tick it fires');
SELECT is((SELECT last_error FROM runrow.schedule WHERE id = :'ten'), NULL, 'which clears last_error');

-- Written ahead by less than the time to its next tick: the tick is right, only updated_at moves.
DELETE FROM runrow.schedule;
SELECT runrow.create_schedule('yearly', '@yearly', '"y"', 'm') AS yearly \gset
SELECT next_fire_at AS yearly_tick FROM runrow.schedule WHERE id = :'yearly' \gset
UPDATE runrow.schedule SET updated_at = now() + interval '2 minutes' WHERE id = :'yearly';
SELECT is((SELECT (enqueued, moved_on)::text FROM runrow.fire_schedules_pass()), (0, 1)::text, 'taken');
SELECT is((SELECT (next_fire_at, last_error, updated_at)::text FROM runrow.schedule WHERE id = :'yearly'),
    (:'yearly_tick'::timestamptz, NULL::text, now())::text, 'its tick kept, no last_error');

-- A busy schedule passed over while the clock was ahead is back in the firing order, and fires.
DELETE FROM runrow.schedule;
SELECT runrow.create_schedule('busy', '*/10 * * * *', '"b"', 'm') AS busy \gset
UPDATE runrow.schedule SET next_fire_at = date_trunc('hour', now()) - interval '1 hour',
    passed_over_at = now() + interval '1 day', updated_at = now() + interval '1 day'
WHERE id = :'busy';
SELECT is((SELECT (enqueued, moved_on)::text FROM runrow.fire_schedules_pass()), (1, 2)::text,
    'a due schedule passed over in the future: cleared, then fired in the same pass');
SELECT is((SELECT (passed_over_at, next_fire_at)::text FROM runrow.schedule WHERE id = :'busy'),
    (NULL::timestamptz, pg_temp.first_tick('*/10 * * * *', now()))::text, 'passed_over_at cleared, fired');

-- A stopped schedule (next_fire_at infinity) stays stopped.
UPDATE runrow.schedule SET next_fire_at = 'infinity', last_error = 'stopped', updated_at = now() + interval '1 day'
WHERE id = :'busy';
SELECT runrow.fire_schedules_pass();
SELECT is((SELECT (next_fire_at, last_error)::text FROM runrow.schedule WHERE id = :'busy'),
    ('infinity'::timestamptz, 'stopped')::text, 'a stopped schedule stays stopped');

-- A tick fired while the clock was ahead is not enqueued again when the clock reaches it: the
-- pass at the future instant, then the clock set back (its rows' updated_at, as that pass wrote them).
DELETE FROM runrow.schedule;
SELECT runrow.create_schedule('daily', '0 0 * * *', '"d"', 'm') AS daily \gset
UPDATE runrow.schedule SET next_fire_at = now() WHERE id = :'daily';
SELECT is(runrow._fire_schedules(now() + interval '1 day', 100), 1, 'a pass a day ahead fires the midnight within it');
SELECT last_run_id AS ahead_run FROM runrow.schedule WHERE id = :'daily' \gset
UPDATE runrow.schedule SET updated_at = now() + interval '1 day' WHERE id = :'daily';
SELECT runrow.fire_schedules_pass();
SELECT is((SELECT next_fire_at FROM runrow.schedule WHERE id = :'daily'), pg_temp.first_tick('0 0 * * *', now()),
    'set back: the next midnight again');
SELECT is(runrow._fire_schedules(pg_temp.first_tick('0 0 * * *', now()) + interval '1 minute', 100), 0,
    'reached again, that midnight enqueues nothing');
SELECT is((SELECT (last_run_id, next_fire_at)::text FROM runrow.schedule WHERE id = :'daily'),
    (:'ahead_run'::uuid, pg_temp.first_tick('0 0 * * *', now()) + interval '1 day')::text,
    'it replayed the run fired while the clock was ahead, and moved on to the next midnight');
SELECT runrow.drop_schedule('daily');

SELECT * FROM finish();
ROLLBACK;
