CREATE OR REPLACE FUNCTION runrow.trim_journal(
    older_than interval DEFAULT '24 hours', max_runs integer DEFAULT 10000
)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    deleted bigint;
    cutoff timestamptz;
    due uuid[];
BEGIN
    PERFORM runrow._require_not_null(trim_journal.older_than, 'older_than');
    PERFORM runrow._require_range(trim_journal.max_runs, 'max_runs', 1, 100000);
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

    -- Served by agent_run_untrimmed, in its order: only finished runs whose snapshot (and so
    -- journal) is still there, never the trimmed history; the oldest max_runs of them, so a
    -- backlog goes in bounded transactions (bench/trim.py: one call for 200,000 runs took
    -- 97 s, past a worker's statement_timeout for a backlog of 1 M).
    SELECT coalesce(array_agg(d.id), '{}') INTO due
    FROM (
        SELECT a.id FROM runrow.agent_run AS a
        WHERE a.finished_at < cutoff
          AND a.finished_at IS NOT NULL
          AND a.request_snapshot IS NOT NULL
        ORDER BY a.finished_at
        LIMIT trim_journal.max_runs
    ) AS d;

    DELETE FROM runrow.run_event AS e WHERE e.run_id = ANY (due);
    GET DIAGNOSTICS deleted = ROW_COUNT;

    UPDATE runrow.agent_run AS a SET request_snapshot = NULL, updated_at = now() WHERE a.id = ANY (due);
    RETURN deleted;
END
$fn$;

COMMENT ON FUNCTION runrow.trim_journal(interval, integer) IS
'Delete the live journal (run_event rows) of runs terminal for longer than older_than '
'(default 24 hours, not negative) and null their request snapshot (the PII copy), for at most '
'max_runs runs per call (default 10000, 1..100000), the longest-ended first: call it again '
'while it returns more than 0 to work through a backlog. Runs, '
'messages, steps and tool effects stay: the journal is a delivery buffer, not the record. '
'A reader of a trimmed run still gets a synthesized complete from read_events. Returns the '
'number of journal rows deleted.';

REVOKE ALL ON FUNCTION runrow.trim_journal(interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.trim_journal(interval, integer) TO runrow_worker;
