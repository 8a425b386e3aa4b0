-- The per-run channel tails LISTEN on: runrow_events_<run id as 32 hex digits>, a plain
-- identifier that needs no quoting in LISTEN.
CREATE OR REPLACE FUNCTION runrow.events_channel(run_id uuid)
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, runrow
AS $fn$
    SELECT 'runrow_events_' || replace(events_channel.run_id::text, '-', '');
$fn$;

REVOKE ALL ON FUNCTION runrow.events_channel(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.events_channel(uuid) TO runrow_worker, runrow_client, runrow_auditor;
COMMENT ON FUNCTION runrow.events_channel(uuid) IS
'The NOTIFY channel of one run''s journal: runrow_events_ followed by the run id as 32 '
'lowercase hex digits (no dashes, so LISTEN needs no quoting). append_events and every '
'terminal write notify it with the last seq as payload; a tail LISTENs on it before reading.';
