-- The wake self-test of a LISTEN hub: a NOTIFY on a channel of the hub's own making, sent
-- through the caller's (possibly pooled) connection, so the hub can tell whether
-- notifications reach its LISTEN session at all. A transaction pooler silently drops them,
-- and then every wake waits for the poll tick. Only runrow_probe_ channels: a caller cannot
-- forge a wake on a run's or the queue's channel with it.
CREATE OR REPLACE FUNCTION runrow.notify_probe(channel text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    IF notify_probe.channel IS NULL THEN
        RAISE EXCEPTION 'channel must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF notify_probe.channel !~ '^runrow_probe_[0-9a-f]{32}$' THEN
        -- Shown below: a control character would reach the log through the error.
        PERFORM runrow._require_printable(notify_probe.channel, 'channel');
        RAISE EXCEPTION 'channel must be runrow_probe_ followed by 32 lowercase hex digits, got %',
            left(notify_probe.channel, 80)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_notify(notify_probe.channel, notify_probe.channel);
    RETURN notify_probe.channel;
END
$fn$;

REVOKE ALL ON FUNCTION runrow.notify_probe(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.notify_probe(text) TO runrow_worker, runrow_client;
COMMENT ON FUNCTION runrow.notify_probe(text) IS
'The LISTEN self-test: NOTIFY channel (runrow_probe_ followed by 32 lowercase hex digits, '
'of the caller''s choosing) with the channel name as payload, delivered at commit; returns '
'the channel. A worker or runrow serve LISTENs on a fresh such channel on its hub connection '
'and calls this through its pool: when the notification never arrives, the hub''s URL goes '
'through a transaction pooler and wakes wait for the poll tick. Writes no row. A NULL channel '
'raises 22004, any other name 22023 (the run and queue channels cannot be notified with it).';
