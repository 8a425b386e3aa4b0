CREATE OR REPLACE FUNCTION runrow.cancel_run(run_id uuid)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
-- Bounded like stop_conversation: a holder frozen inside its transaction gets 5 s in all (also
-- when other stops of the run wait ahead: runrow._lock_run_by), then the cancel fails with 55P03
-- (runrow._stop_timed_out) and the caller retries.
SET lock_timeout = '5s'
AS $fn$
DECLARE
    deadline timestamptz := clock_timestamp() + current_setting('lock_timeout')::interval;
BEGIN
    PERFORM runrow._require_not_null(cancel_run.run_id, 'run_id');
    BEGIN
        IF NOT runrow._lock_run_by(cancel_run.run_id, deadline) THEN
            RAISE EXCEPTION 'run_id % does not exist', cancel_run.run_id USING ERRCODE = 'no_data_found';
        END IF;
        RETURN runrow._stop_run(cancel_run.run_id);
    EXCEPTION WHEN lock_not_available THEN
        PERFORM runrow._stop_timed_out(NULL, cancel_run.run_id);
    END;
END
$fn$;

COMMENT ON FUNCTION runrow.cancel_run(uuid) IS
'Stop one run, as stop_conversation does for a whole conversation: a queued or waiting run '
'is cancelled outright (message handed back as a draft) and cancel_run returns cancelled; a '
'running run gets cancel_requested and a NOTIFY on runrow_cancel, returns cancel_requested, '
'and its worker finalizes it. A run that already ended is left alone: already_<status>. An '
'unknown run_id raises P0002. A row lock not granted within the function''s lock_timeout '
'(5 s in all on the database clock, other stops of the run waiting ahead included; a holder '
'frozen inside its transaction) raises 55P03 naming the run; nothing is written.';

REVOKE ALL ON FUNCTION runrow.cancel_run(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.cancel_run(uuid) TO runrow_client;
