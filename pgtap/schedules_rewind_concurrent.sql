-- A row another pass wrote after this pass's transaction began is not "written ahead" (migration
-- 0106). _rewind_schedules took updated_at > now(), and now() is the transaction's start: a pass
-- B that fired and committed between pass A's start and A's read of the candidates left
-- updated_at later than A's now(), so A took the healthy row for one written by a clock that ran
-- ahead, moved its tick back and said the clock was set back (the SQL review of 0103, F6). Now
-- the bound is also the real clock, clock_timestamp(), which no committed now() is later than
-- (tests/test_schedules.py has the two sessions; here one transaction stands for them: B's pass
-- stamps now(), A's pass is called at an instant just before it).
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(3);
SELECT pg_temp.drain_queue();
DELETE FROM runrow.schedule;  -- only this file's schedules fire

SELECT runrow.create_schedule('m', '* * * * *', '"t"', 'm') AS m \gset
UPDATE runrow.schedule SET next_fire_at = date_trunc('minute', now()), updated_at = now() WHERE id = :'m';
SELECT runrow._fire_schedules_pass(now(), 100);  -- pass B fires the tick: updated_at = now()
SELECT next_fire_at AS fired_next FROM runrow.schedule WHERE id = :'m' \gset
-- Pass A, whose transaction began a moment before B's (its `at` is its now()).
SELECT is((SELECT (enqueued, moved_on)::text
        FROM runrow._fire_schedules_pass(date_trunc('minute', now()) - interval '1 millisecond', 100)),
    (0, 0)::text, 'pass A takes nothing: the row was written by B, not by a clock that ran ahead');
SELECT is((SELECT next_fire_at FROM runrow.schedule WHERE id = :'m'), :'fired_next'::timestamptz,
    'the tick B fired is not moved back (it would be replayed)');
SELECT is((SELECT last_error FROM runrow.schedule WHERE id = :'m'), NULL,
    'and no last_error blames a clock set back that never happened');

SELECT * FROM finish();
ROLLBACK;
