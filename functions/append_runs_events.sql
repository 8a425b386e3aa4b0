CREATE OR REPLACE FUNCTION runrow.append_runs_events(runs jsonb)
RETURNS TABLE (run_id uuid, last_seq bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
-- As finish_runs: one plan for every batch size, and never a scan of the runs' history. Never
-- JIT-compiled: after a trim the wake probe's lookup of each run's last seq is priced above
-- jit_above_cost (see read_events, migration 0063).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $fn$
DECLARE
    ids uuid[];
BEGIN
    ids := runrow._append_runs_input(append_runs_events.runs);

    -- One statement for the whole batch, not a few per run: the fence of every run (its row
    -- locked FOR NO KEY UPDATE where its claim_token still matches, rechecked on the row's
    -- latest version once the lock is granted, as _hold_claim does for one run), every held
    -- run's events in one INSERT, each run's in array order, numbered by the guard trigger from
    -- the run's last seq (a row's lookup sees the rows this INSERT wrote before it), and a row
    -- per element in input order. A run fenced out is not held and writes nothing.
    RETURN QUERY
    WITH held AS (
        SELECT r.id, x.el -> 'events' AS events
        FROM jsonb_array_elements(append_runs_events.runs) AS x (el)
        INNER JOIN runrow.agent_run AS r
            ON r.id = (x.el ->> 'run_id')::uuid AND r.claim_token = (x.el ->> 'claim_token')::uuid
        -- Redundant with the join, and what keeps it a probe by key: without it a hash join read
        -- all of agent_run_pkey while the table was small (a few thousand runs).
        WHERE r.id = ANY (ids)
        FOR NO KEY UPDATE OF r
    ),
    journaled AS (
        INSERT INTO runrow.run_event (run_id, seq, type, payload)
        SELECT h.id, NULL::bigint, e.ev ->> 'type', e.ev
        FROM held AS h
        CROSS JOIN LATERAL jsonb_array_elements(h.events) WITH ORDINALITY AS e (ev, ord)
        ORDER BY h.id, e.ord
        RETURNING run_event.run_id, run_event.seq
    )
    SELECT i.id, l.seq
    FROM unnest(ids) WITH ORDINALITY AS i (id, ord)
    LEFT JOIN (SELECT j.run_id, max(j.seq) AS seq FROM journaled AS j GROUP BY j.run_id) AS l ON i.id = l.run_id
    ORDER BY i.ord;

    -- The tails of the written runs some tail watches, woken once each with the run's last
    -- seq. Probed first (nearly every flush has no watched run), a statement after every run's
    -- lock (see _wake_tails); a run written here is one this transaction still holds with the
    -- token it was given.
    IF current_setting('transaction_isolation') <> 'read committed'
       OR EXISTS (SELECT 1 FROM runrow.run_watch AS w WHERE w.run_id = ANY (ids) AND w.expires_at > now()) THEN
        PERFORM pg_notify(runrow.events_channel(r.id),
                          (SELECT e.seq FROM runrow.run_event AS e WHERE e.run_id = r.id
                           ORDER BY e.seq DESC LIMIT 1)::text)
        FROM jsonb_array_elements(append_runs_events.runs) AS x (el)
        INNER JOIN runrow.agent_run AS r
            ON r.id = (x.el ->> 'run_id')::uuid AND r.claim_token = (x.el ->> 'claim_token')::uuid
        WHERE r.id = ANY (ids)
          AND (current_setting('transaction_isolation') <> 'read committed'
           OR EXISTS (SELECT 1 FROM runrow.run_watch AS w WHERE w.run_id = r.id AND w.expires_at > now()));
    END IF;
END
$fn$;

COMMENT ON FUNCTION runrow.append_runs_events(jsonb) IS
'Append events to many running runs in one call: runs is a JSON array of at most 1000 objects '
'{run_id, claim_token, events}, each run at most once, each events array as append_events takes it '
'(1 to 1000 objects with a string "type", "complete" and run_* reserved, at most 4 MiB). Each run '
'is fenced on its own exactly as append_events is (its claim_token, checked under the run row''s '
'lock): a run fenced out writes nothing and comes back with last_seq NULL, the '
'others are written all or nothing each at their next seqs. One row per element, in input order, '
'with the last seq written; each written run''s events_channel is notified once if a tail watches '
'it. Bad input raises 22004/22023 naming the element (runs[i]) and writes nothing. A worker '
'flushing the deltas of many streaming runs sends one statement per flush instead of one per run.';

REVOKE ALL ON FUNCTION runrow.append_runs_events(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.append_runs_events(jsonb) TO runrow_worker;
