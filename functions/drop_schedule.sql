CREATE OR REPLACE FUNCTION runrow.drop_schedule(name text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    PERFORM runrow._require_not_null(drop_schedule.name, 'name');
    -- Waits for a reaper pass that is firing this schedule right now, so a tick it enqueues
    -- is the last one.
    DELETE FROM runrow.schedule AS s WHERE s.name = drop_schedule.name;
    IF NOT FOUND THEN
        -- No schedule is named with a control character since 0067/0085, and the name is quoted
        -- below, where one would reach the log. Tested only here, when nothing was found: a
        -- name stored before the rule is still dropped.
        PERFORM runrow._require_printable(drop_schedule.name, 'name');
        RAISE EXCEPTION 'name "%" is not the name of a schedule', left(drop_schedule.name, 200)
            USING ERRCODE = 'no_data_found', HINT = 'runrow.schedules lists them.';
    END IF;
END
$fn$;

COMMENT ON FUNCTION runrow.drop_schedule(text) IS
'Delete the schedule named `name`: no tick of it fires after this commits (a reaper pass firing '
'it at that moment finishes first). Runs it already enqueued stay and run. An unknown name '
'raises P0002 naming name, NULL raises 22004; nothing is written.';

REVOKE ALL ON FUNCTION runrow.drop_schedule(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.drop_schedule(text) TO runrow_client;
