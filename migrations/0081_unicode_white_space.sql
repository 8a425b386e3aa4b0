-- depends: 0080_model_call_reserved
-- White space is Unicode's White_Space in every rule that speaks of it (runrow._white_space,
-- functions/_request_checks.sql; the SQL audit: a name beginning with a no-break space was
-- taken, a lone U+00A0 named the person who approved an irreversible call). That widens the rule
-- on schedule names (runrow._schedule_name_ok, now in functions/create_schedule.sql), and the
-- table enforced it by a CHECK (schedule_name_printable, migration 0067). A CHECK is evaluated on
-- every update of a row, so a schedule whose name the wider rule refuses, written before it,
-- would refuse the firing pass's update of next_fire_at and with it the whole pass, every pass
-- (the oldest due schedule stops them all). The same held for names written before 0067, which
-- that migration left NOT VALID. So the rule is now a trigger of the same name that runs when a
-- name is written (insert, or an update of name), raising the CHECK's 23514: a name already
-- stored stays, fires, and is still dropped by name.

ALTER TABLE runrow.schedule DROP CONSTRAINT schedule_name_printable;

CREATE FUNCTION runrow._schedule_name_printable() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
    IF NOT runrow._schedule_name_ok(NEW.name) THEN
        RAISE EXCEPTION 'new row for relation "schedule" violates check constraint "schedule_name_printable"'
            USING ERRCODE = 'check_violation', SCHEMA = 'runrow', TABLE = 'schedule',
                CONSTRAINT = 'schedule_name_printable',
                DETAIL = format('name "%s" holds a control character or begins or ends with white space',
                    left(NEW.name, 200));
    END IF;
    RETURN NEW;
END
$fn$;

COMMENT ON FUNCTION runrow._schedule_name_printable() IS
'schedule''s BEFORE INSERT OR UPDATE OF name row trigger: the name must pass _schedule_name_ok '
'(no control character, no white space at either end), else 23514 as the CHECK of the same name '
'(migration 0067) raised; a name already stored is not checked again when other columns change.';

REVOKE ALL ON FUNCTION runrow._schedule_name_printable() FROM PUBLIC;

CREATE TRIGGER schedule_name_printable
BEFORE INSERT OR UPDATE OF name ON runrow.schedule
FOR EACH ROW EXECUTE FUNCTION runrow._schedule_name_printable();
