CREATE OR REPLACE FUNCTION runrow.trim_journal(older_than interval DEFAULT '24 hours')
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    deleted bigint;
    cutoff timestamptz;
BEGIN
    PERFORM runrow._require_not_null(trim_journal.older_than, 'older_than');
    IF trim_journal.older_than < interval '0' THEN
        RAISE EXCEPTION 'older_than must not be negative, got %', trim_journal.older_than
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- An interval reaching before 4713 BC overflows timestamptz: bad input, named as such.
    BEGIN
        cutoff := now() - trim_journal.older_than;
    EXCEPTION WHEN datetime_field_overflow THEN
        RAISE EXCEPTION 'older_than is out of range, got %', trim_journal.older_than
            USING ERRCODE = 'invalid_parameter_value';
    END;

    DELETE FROM runrow.run_event AS e
    USING runrow.agent_run AS a
    WHERE a.id = e.run_id
      AND a.status IN ('completed', 'failed', 'cancelled', 'dead')
      AND a.finished_at < cutoff;
    GET DIAGNOSTICS deleted = ROW_COUNT;

    UPDATE runrow.agent_run AS a
    SET request_snapshot = NULL
    WHERE a.status IN ('completed', 'failed', 'cancelled', 'dead')
      AND a.finished_at < cutoff
      AND a.request_snapshot IS NOT NULL;
    RETURN deleted;
END
$fn$;

COMMENT ON FUNCTION runrow.trim_journal(interval) IS
'Delete the live journal (run_event rows) of runs terminal for longer than older_than '
'(default 24 hours, not negative) and null their request snapshot (the PII copy). Runs, '
'messages, steps and tool effects stay: the journal is a delivery buffer, not the record. '
'A reader of a trimmed run still gets a synthesized complete from read_events. Returns the '
'number of journal rows deleted.';

REVOKE ALL ON FUNCTION runrow.trim_journal(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.trim_journal(interval) TO runrow_worker;
