CREATE OR REPLACE FUNCTION runrow.trim_journal(
    older_than interval DEFAULT '24 hours', max_runs integer DEFAULT 10000
)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
-- Its deletes go by the journal's key; once a trim has emptied most of it, the planner prices
-- each by that key's pages and a call would JIT-compile them (migration 0063), for nothing.
SET jit = off
AS $fn$
DECLARE
    deleted bigint;
    purged bigint;
    cutoff timestamptz;
    due uuid[];
    purgeable uuid[];
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
    -- Negative by the calendar though not by comparison: '-1 year 360 days' compares as 0
    -- (a year is 360 days there, a month 30) and put the cutoff 5 days in the future.
    IF cutoff > now() THEN
        RAISE EXCEPTION 'older_than must not be negative, got %', trim_journal.older_than
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The untrimmed runs in enqueue order (run_request's UUIDv7 key), up to the cutoff's
    -- millisecond: a run that ended before the cutoff was enqueued before it. So the walk reads
    -- the untrimmed runs enqueued before the cutoff (the due ones, and the few still open or
    -- ended since), never the trimmed history; the oldest max_runs due ones, so a backlog goes
    -- in bounded transactions (bench/trim.py: one call for 200,000 runs took 97 s, past a
    -- worker's statement_timeout for a backlog of 1 M). The bound is the smallest UUID of the
    -- millisecond after the cutoff's (key and cutoff both in whole milliseconds).
    SELECT coalesce(array_agg(d.run_id), '{}') INTO due
    FROM (
        SELECT q.run_id
        FROM runrow.run_request AS q
        WHERE q.id < encode(
                  overlay(
                      '\x00000000000000000000000000000000'::bytea
                      PLACING substr(int8send(floor(extract(EPOCH FROM cutoff) * 1000)::bigint + 1), 3)
                      FROM 1 FOR 6
                  ),
                  'hex'
              )::uuid
          -- A scalar subquery, never flattened into a join: the walk stays run_request's key
          -- in order, stopped by the LIMIT, whatever the statistics say about agent_run.
          AND (SELECT a.finished_at FROM runrow.agent_run AS a WHERE a.id = q.run_id) < cutoff
        ORDER BY q.id
        LIMIT trim_journal.max_runs
    ) AS d;

    DELETE FROM runrow.run_event AS e WHERE e.run_id = ANY (due);
    GET DIAGNOSTICS deleted = ROW_COUNT;

    DELETE FROM runrow.run_request AS q WHERE q.run_id = ANY (due);

    -- Delivered webhook deliveries delivered before the cutoff, the earliest first, at most
    -- max_runs: the outbox kept every delivered row forever. By delivered_at, not with the runs
    -- above: a run's journal goes once (its run_request with it), and a delivery retried past
    -- that, or re-armed by a person, is delivered after the trim that took its run. Through
    -- webhook_delivery_delivered (delivered rows by delivered_at), so a call reads what it
    -- deletes and not the history; SKIP LOCKED, as every worker's reaper calls this. Dead
    -- letters stay: a person may still re-arm one (retry_webhook_delivery), and runrow never
    -- drops what nobody was told.
    -- The ids first, as the runs' above: a LIMIT ... SKIP LOCKED subquery inside the DELETE may
    -- be planned on the inner side of a join and run again per row, each run taking other rows
    -- (seen: 3 deleted at max_runs 2, the index read 4 times, once the table's statistics moved).
    purgeable := ARRAY(
        SELECT d.id
        FROM runrow.webhook_delivery AS d
        WHERE d.state = 'delivered' AND d.delivered_at < cutoff
        ORDER BY d.delivered_at
        LIMIT trim_journal.max_runs
        FOR UPDATE SKIP LOCKED
    );
    DELETE FROM runrow.webhook_delivery AS w WHERE w.id = ANY (purgeable);
    GET DIAGNOSTICS purged = ROW_COUNT;
    RETURN deleted + purged;
END
$fn$;

COMMENT ON FUNCTION runrow.trim_journal(interval, integer) IS
'Delete the live journal (run_event rows) of runs terminal for longer than older_than '
'(default 24 hours, not negative) and delete their request snapshot (run_request, the PII copy), '
'for at most max_runs runs per call (default 10000, 1..100000), the earliest-enqueued first; and '
'delete at most max_runs webhook deliveries delivered longer than older_than ago, the earliest '
'delivered first (dead-lettered ones stay, for retry_webhook_delivery). Call it again while it '
'returns more than 0 to work through a backlog. Runs, '
'messages, steps and tool effects stay: the journal is a delivery buffer, not the record. '
'A reader of a trimmed run still gets a synthesized complete from read_events. Returns the '
'number of rows deleted: journal rows plus deliveries.';

REVOKE ALL ON FUNCTION runrow.trim_journal(interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.trim_journal(interval, integer) TO runrow_worker;
