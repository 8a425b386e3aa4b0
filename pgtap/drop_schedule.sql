-- runrow.drop_schedule: the schedule is gone and fires no more; the runs it enqueued stay.
-- An unknown or NULL name raises and writes nothing.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(11);
DELETE FROM runrow.schedule;  -- only this file's schedules fire

SELECT has_function('runrow', 'drop_schedule', ARRAY['text'], 'drop_schedule(name) exists');
SELECT is_definer('runrow', 'drop_schedule', ARRAY['text'], 'drop_schedule is SECURITY DEFINER');
SELECT function_returns('runrow', 'drop_schedule', ARRAY['text'], 'void', 'and returns nothing');

SELECT runrow.create_schedule('hourly', '0 * * * *', '"x"', 'test-model') AS hourly \gset
UPDATE runrow.schedule SET next_fire_at = next_fire_at - interval '1 hour' WHERE id = :'hourly';
SELECT is(runrow.fire_schedules(), 1, 'set-up: the schedule fired one tick');
SELECT last_run_id AS fired FROM runrow.schedule WHERE id = :'hourly' \gset

SELECT lives_ok($$SELECT runrow.drop_schedule('hourly')$$, 'drop_schedule drops it');
SELECT is((SELECT count(*)::int FROM runrow.schedules WHERE name = 'hourly'), 0, 'it is gone from runrow.schedules');
SELECT is(pg_temp.status(:'fired'), 'queued', 'the run it enqueued stays queued');
SELECT is(runrow._fire_schedules(now() + interval '1 day', 100), 0, 'and no tick fires any more');

SELECT runrow.create_schedule('kept', '0 * * * *', '"x"', 'test-model');
SELECT md5(string_agg(to_jsonb(s)::text, '' ORDER BY s.id)) AS before FROM runrow.schedule AS s \gset
SELECT throws_ok($$SELECT runrow.drop_schedule('hourly')$$, 'P0002', 'name "hourly" is not the name of a schedule',
    'an unknown name: P0002 naming name');
SELECT throws_ok($$SELECT runrow.drop_schedule(NULL)$$, '22004', 'name must not be NULL', 'NULL name: 22004');
SELECT is((SELECT md5(string_agg(to_jsonb(s)::text, '' ORDER BY s.id)) FROM runrow.schedule AS s), :'before',
    'neither wrote anything');

SELECT * FROM finish();
ROLLBACK;
