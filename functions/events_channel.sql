-- The per-run channel tails LISTEN on: runrow_events_<run id as 32 hex digits>, a plain
-- identifier that needs no quoting in LISTEN. PL/pgSQL (not SQL) only so a NULL run id
-- raises like every other function instead of yielding a NULL channel name.
CREATE OR REPLACE FUNCTION runrow.events_channel(run_id uuid)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    IF events_channel.run_id IS NULL THEN
        RAISE EXCEPTION 'run_id must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    RETURN 'runrow_events_' || replace(events_channel.run_id::text, '-', '');
END
$fn$;

REVOKE ALL ON FUNCTION runrow.events_channel(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.events_channel(uuid) TO runrow_worker, runrow_client, runrow_auditor;
COMMENT ON FUNCTION runrow.events_channel(uuid) IS
'The NOTIFY channel of one run''s journal: runrow_events_ followed by the run id as 32 '
'lowercase hex digits (no dashes, so LISTEN needs no quoting). Only while the run is watched '
'(watch_runs) do append_events and the journal writes a tail waits for (complete, requeue, '
'cancel request) notify it, with the last seq as payload; an unwatched run is written '
'without a NOTIFY. A tail LISTENs on it, then calls watch_runs and trusts a wait only once '
'the run is watching, then reads. A NULL run_id raises 22004.';
