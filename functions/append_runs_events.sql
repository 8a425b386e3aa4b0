CREATE OR REPLACE FUNCTION runrow.append_runs_events(runs jsonb)
RETURNS TABLE (run_id uuid, last_seq bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow
-- As finish_runs: one plan for every batch size, and never a scan of the runs' history.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $fn$
DECLARE
    inp record;
    done_ids uuid[];
    done_seqs bigint[];
BEGIN
    inp := runrow._append_runs_input(append_runs_events.runs);

    -- Two statements for the whole batch, not two per run: the fence of every run (its row
    -- locked FOR NO KEY UPDATE where its claim_token still matches, rechecked on the row's
    -- latest version once the lock is granted, as _hold_claim does for one run), then every
    -- held run's events in one INSERT, each run's in array order, numbered by the guard
    -- trigger from the run's last seq (a row's lookup sees the rows this INSERT wrote before
    -- it). A run fenced out is not held and writes nothing.
    WITH held AS (
        SELECT r.id
        FROM runrow.agent_run AS r
        INNER JOIN unnest(inp.ids, inp.tokens) AS v (id, token) ON r.id = v.id AND r.claim_token = v.token
        FOR NO KEY UPDATE OF r
    ),
    journaled AS (
        INSERT INTO runrow.run_event (run_id, seq, type, payload)
        SELECT h.id, NULL::bigint, x.ev ->> 'type', x.ev
        FROM held AS h
        INNER JOIN unnest(inp.ids, inp.events) AS v (id, events) ON h.id = v.id
        CROSS JOIN LATERAL jsonb_array_elements(v.events) WITH ORDINALITY AS x (ev, ord)
        ORDER BY h.id, x.ord
        RETURNING run_event.run_id, run_event.seq
    )
    SELECT array_agg(l.run_id), array_agg(l.seq)
    INTO done_ids, done_seqs
    FROM (SELECT j.run_id, max(j.seq) AS seq FROM journaled AS j GROUP BY j.run_id) AS l;

    -- The tails of the runs some tail watches, woken once each with the run's last seq: one
    -- probe of run_watch for the batch, a statement after every run's lock (see _wake_tails).
    IF done_ids IS NOT NULL THEN
        PERFORM pg_notify(runrow.events_channel(w.id), w.seq::text)
        FROM unnest(done_ids, done_seqs) AS w (id, seq)
        WHERE current_setting('transaction_isolation') <> 'read committed'
           OR EXISTS (SELECT 1 FROM runrow.run_watch AS rw WHERE rw.run_id = w.id AND rw.expires_at > now());
    END IF;

    RETURN QUERY
    SELECT x.id, d.seq
    FROM unnest(inp.ids) WITH ORDINALITY AS x (id, ord)
    LEFT JOIN unnest(done_ids, done_seqs) AS d (id, seq) ON x.id = d.id
    ORDER BY x.ord;
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
