-- _rewind_schedules' max_schedules is spent on the rows it writes (migration 0106). It read the
-- earliest max_schedules rows written ahead and skipped, without writing them, the stopped ones
-- (next_fire_at infinity) and those whose cron does not parse: written ahead, they stayed the
-- earliest on every pass, and a live schedule written ahead behind max_schedules of them was
-- never moved back (the SQL review of 0103, F4).
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(6);
SELECT pg_temp.drain_queue();
DELETE FROM runrow.schedule;  -- only this file's schedules fire

-- Two stopped schedules written ahead, the earliest, and a live one written ahead after them.
SELECT runrow.create_schedule('s1', '*/10 * * * *', '"t"', 'm') AS s1 \gset
SELECT runrow.create_schedule('s2', '*/10 * * * *', '"t"', 'm') AS s2 \gset
SELECT runrow.create_schedule('live', '*/10 * * * *', '"t"', 'm') AS live \gset
UPDATE runrow.schedule SET next_fire_at = 'infinity', last_error = 'stopped', updated_at = now() + interval '1 hour'
WHERE id IN (:'s1', :'s2');
UPDATE runrow.schedule SET next_fire_at = now() + interval '1 day', updated_at = now() + interval '2 hours'
WHERE id = :'live';
SELECT is((SELECT (enqueued, moved_on)::text FROM runrow._fire_schedules_pass(now(), 2)), (0, 1)::text,
    'a pass of max_schedules 2 moves the live schedule back past two stopped ones (moved_on 1)');
SELECT is((SELECT next_fire_at FROM runrow.schedule WHERE id = :'live'),
    runrow._cron_next(runrow._cron_parse('*/10 * * * *'), now()), 'its next tick is the first after now');
SELECT is((SELECT count(*)::integer FROM runrow.schedule
        WHERE id IN (:'s1', :'s2') AND next_fire_at = 'infinity' AND last_error = 'stopped'), 2,
    'the stopped ones stay stopped, untouched');

-- A cron that does not parse, written ahead, in front of a live one: stopped as the firing pass
-- stops it (next_fire_at infinity, last_error says why), so it is taken once.
DELETE FROM runrow.schedule;
SELECT runrow.create_schedule('edited', '0 9 * * mon-fri', '"x"', 'm') AS edited \gset
SELECT runrow.create_schedule('live', '*/10 * * * *', '"t"', 'm') AS live \gset
ALTER TABLE runrow.schedule DISABLE TRIGGER schedule_cron_parses;
UPDATE runrow.schedule SET cron = '0 9 * * mon-fry', updated_at = now() + interval '1 hour' WHERE id = :'edited';
ALTER TABLE runrow.schedule ENABLE TRIGGER schedule_cron_parses;
UPDATE runrow.schedule SET next_fire_at = now() + interval '1 day', updated_at = now() + interval '2 hours'
WHERE id = :'live';
SELECT runrow._fire_schedules_pass(now(), 1);
SELECT is((SELECT (next_fire_at, last_error LIKE 'cron does not parse, so the schedule stopped: cron "0 9 * * mon-fry"%')::text
        FROM runrow.schedule WHERE id = :'edited'),
    ('infinity'::timestamptz, true)::text, 'the pass stops the schedule whose cron does not parse, saying why');
SELECT is((SELECT (enqueued, moved_on)::text FROM runrow._fire_schedules_pass(now(), 1)), (0, 1)::text,
    'the next pass of max_schedules 1 takes the live one');
SELECT is((SELECT next_fire_at FROM runrow.schedule WHERE id = :'live'),
    runrow._cron_next(runrow._cron_parse('*/10 * * * *'), now()), 'and moves it back');

SELECT * FROM finish();
ROLLBACK;
