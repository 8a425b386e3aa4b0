-- depends: 0066_webhook_failure_can_be_permanent
-- Schedules: what issue 11's schedule audit found the table let through.
--
-- - A name with a control character (a line break broke `runrow schedules`' table) or white
--   space at either end (it could not be typed back to drop the schedule). create_schedule
--   refuses them, with this function, and so does the table: schedule_name_printable. A name
--   written before this migration is left as it is (NOT VALID), and is still dropped by name.
--   The function is defined here, not in functions/, because the CHECK needs it to exist when
--   the migration runs.
-- - A cron that does not parse, written around create_schedule: every firing pass raised on it,
--   the oldest due schedule, so no schedule of the fleet fired. A row trigger now parses the
--   cron on every insert and on every update of it (runrow._cron_parse, in functions/, is
--   looked up when the trigger runs, so a fresh install can create the trigger before it).
--   _fire_schedules stops a schedule whose cron no longer parses, not the pass.
-- - Each schedule's prompt is pinned when the schedule is created (create_schedule), so firing
--   passes only read it; the prompts of the schedules created before are pinned here.

-- OR REPLACE (since migration 0081): functions/create_schedule.sql defines it now, and a database
-- whose functions/ were applied before this migration ran (an upgrade test's partial migrate)
-- already has it.
CREATE OR REPLACE FUNCTION runrow._schedule_name_ok(name text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT name !~ '[[:cntrl:]]' AND name !~ '^[[:space:]]' AND name !~ '[[:space:]]$'
$fn$;

COMMENT ON FUNCTION runrow._schedule_name_ok(text) IS
'Private. TRUE when a schedule name holds no control character and no white space at either '
'end: create_schedule''s rule and the table''s schedule_name_printable. Inlined.';

REVOKE ALL ON FUNCTION runrow._schedule_name_ok(text) FROM PUBLIC;

ALTER TABLE runrow.schedule
ADD CONSTRAINT schedule_name_printable CHECK (runrow._schedule_name_ok(name)) NOT VALID;

CREATE FUNCTION runrow._schedule_cron_parses() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
    PERFORM runrow._cron_parse(NEW.cron);  -- raises 22004/22023 naming cron
    RETURN NEW;
END
$fn$;

COMMENT ON FUNCTION runrow._schedule_cron_parses() IS
'schedule''s BEFORE INSERT OR UPDATE OF cron row trigger: the cron must parse (_cron_parse''s '
'22004/22023 naming cron otherwise), whoever writes the row, or every firing pass would stop '
'on it.';

REVOKE ALL ON FUNCTION runrow._schedule_cron_parses() FROM PUBLIC;

CREATE TRIGGER schedule_cron_parses
BEFORE INSERT OR UPDATE OF cron ON runrow.schedule
FOR EACH ROW EXECUTE FUNCTION runrow._schedule_cron_parses();

DO $$
DECLARE
    s record;
BEGIN
    -- A fresh install has no schedules, so _pin_prompt (functions/) is not called before it exists.
    FOR s IN SELECT DISTINCT x.system_prompt, x.tools FROM runrow.schedule AS x LOOP
        PERFORM runrow._pin_prompt(s.system_prompt, s.tools);
    END LOOP;
END
$$;
