CREATE OR REPLACE FUNCTION runrow.finish_runs(runs jsonb)
RETURNS TABLE (run_id uuid, finished boolean, last_seq bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
-- The statements' shapes are fixed: plan them once per session, not for every call (the
-- custom plans PL/pgSQL tries first, and keeps for = ANY (array), cost more to build than
-- to run).
SET plan_cache_mode = force_generic_plan
-- Every lookup here is by key (agent_run's and run_watch's primary keys, the journal's): a
-- generic plan made while agent_run was small (a fresh install, planned as 10 pages) found a
-- sequential scan cheaper than ten key probes and kept it as the table grew.
SET enable_seqscan = off
AS $fn$
DECLARE
    ids uuid[];
    tokens uuid[];
    statuses text[];
    results jsonb[];
    errors text[];
    events jsonb[];
    done_ids uuid[];
    done_seqs bigint[];
    -- The finished runs of tenants with a budget: the only runs a reservation can be left for.
    budgeted uuid[];
    -- The input check's result, read as a simple expression (see finish_and_claim_runs).
    inp record;
BEGIN
    inp := runrow._finish_runs_input(finish_runs.runs);
    ids := inp.ids;
    tokens := inp.tokens;
    statuses := inp.statuses;
    results := inp.results;
    errors := inp.errors;
    events := inp.events;

    -- The fenced terminal writes, each exactly finish_run's: only while the token matches,
    -- which is only while the run is running (agent_run_claim_iff_running: a claim token is
    -- set exactly while the status is 'running'); a run fenced out is simply not updated.
    -- The status is deliberately not tested here: a test the planner can match to the
    -- partial index of active runs made the generic plan AND that index with the primary
    -- key, and a bitmap scan reads every dead entry of runs ended since the last vacuum
    -- (8,283 index entries per call after a 15,000-run drain). Only the primary key serves
    -- this lookup (and enable_seqscan = off keeps a small table's plan from scanning it): the
    -- input's rows, joined to it one probe each.
    -- Then each finished run's events and its complete event at the next seqs, as
    -- append_events and finish_run would journal them in one transaction.
    WITH fin AS (
        UPDATE runrow.agent_run AS r
        SET status = v.status,
            result = v.result,
            error = v.error,
            finished_at = now(),
            claim_token = NULL,
            claim_expires_at = NULL,
            -- Every writer stamps updated_at itself (no BEFORE trigger does, since 0030).
            updated_at = now()
        FROM unnest(ids, tokens, statuses, results, errors, events) AS v (id, token, status, result, error, events)
        WHERE r.id = v.id AND r.claim_token = v.token
        RETURNING r.id, r.conversation_id, r.status, r.result, r.error, v.events, r.fairness_key
    ),
    journaled AS (
        -- seq NULL: the guard trigger assigns each row the next one of its run, in this
        -- order (it sees the rows inserted before it), and RETURNING reads them back.
        -- The run's own events, then its complete as a row of its own (not appended to the
        -- events' array, which built the array again only to take it apart).
        INSERT INTO runrow.run_event (run_id, seq, type, payload)
        SELECT f.id, NULL::bigint, e.type, e.ev
        FROM fin AS f
        CROSS JOIN LATERAL (
            SELECT x.ev ->> 'type', x.ev, x.ord
            FROM jsonb_array_elements(f.events) WITH ORDINALITY AS x (ev, ord)
            UNION ALL
            SELECT 'complete',
                   jsonb_build_object('type', 'complete', 'status', f.status, 'result', f.result, 'error', f.error),
                   9223372036854775807
        ) AS e (type, ev, ord)
        ORDER BY f.id, e.ord
        RETURNING run_event.run_id, run_event.seq
    )
    -- A run's call granted and never settled (the API refused it: the run fails) holds nothing
    -- back any more, as finish_run has it: its reservation leaves its tenant's total. A call is
    -- reserved only under a tenant's budget, so only those runs go to _tenant_unreserve_runs
    -- (not gated on model_call_reserved as finish_run is: see there). The budgets are probed per
    -- run only when there is one at all: without, the probe is one read of an empty index per
    -- call (10-run batch: 201 shared buffers against 200 before; a budget of another tenant,
    -- 212; the runs' tenant's, 237, the reservations looked for).
    SELECT array_agg(l.run_id), array_agg(l.seq), array_agg(l.run_id) FILTER (WHERE b.fairness_key IS NOT NULL)
    INTO done_ids, done_seqs, budgeted
    FROM (SELECT j.run_id, max(j.seq) AS seq FROM journaled AS j GROUP BY j.run_id) AS l
    JOIN fin AS f ON f.id = l.run_id
    LEFT JOIN (
        SELECT t.fairness_key FROM runrow.tenant_budget AS t WHERE EXISTS (SELECT 1 FROM runrow.tenant_budget)
    ) AS b ON b.fairness_key = f.fairness_key;
    IF budgeted IS NOT NULL THEN
        PERFORM runrow._tenant_unreserve_runs(budgeted);
    END IF;

    -- The wakes: each finished run's tails once, with its last seq, if a tail watches it
    -- (its watches go: nothing more is written to an ended run); the dispatchers were woken
    -- by the UPDATE's triggers where an ending lets a run start (migration 0025).
    -- Most endings have no tail: one probe of run_watch's key decides, instead of the helper's
    -- call, DELETE and PERFORM (about 36 us of a one-run call). Expired watches are found too,
    -- and the helper drops them; a snapshot older than the statement (REPEATABLE READ) may
    -- predate a watch, so the helper always runs there (it then notifies every ended run).
    IF done_ids IS NOT NULL AND (
        current_setting('transaction_isolation') <> 'read committed'
        OR EXISTS (SELECT 1 FROM runrow.run_watch AS w WHERE w.run_id = ANY (done_ids))
    ) THEN
        PERFORM runrow._wake_tails_ended_batch(done_ids, done_seqs);
    END IF;

    RETURN QUERY
    SELECT x.id, d.seq IS NOT NULL, d.seq
    -- ids is the input's order, already parsed: the JSON is not read again.
    FROM unnest(ids) WITH ORDINALITY AS x (id, ord)
    LEFT JOIN unnest(done_ids, done_seqs) AS d (id, seq) ON d.id = x.id
    ORDER BY x.ord;
END
$fn$;

COMMENT ON FUNCTION runrow.finish_runs(jsonb) IS
'Many fenced terminal writes in one call: runs is a JSON array (at most 1000) of objects '
'{run_id, claim_token, status, result?, error?, events?}. Each run is fenced on its own exactly '
'as finish_run: only while its claim_token matches and it is running; then its events (as '
'append_events would append them) and the one complete event are journaled at the next seqs, '
'its tails are notified once with the last seq (when a tail watches it: watch_runs), and the '
'dispatchers once per conversation whose next turn (or capped key) may now start. A '
'run fenced out writes nothing and comes back finished = false, last_seq NULL; the others '
'proceed. One row per element, in input order. Bad input (runs not an array, an element not an '
'object, an unknown key, a missing or malformed run_id, claim_token or status, a result over 1 MiB '
'or one JSON clients cannot read back (100 levels deep, a number beyond a double''s range), oversize '
'error or events, a reserved event type, a run twice) raises 22004/22023 naming the element '
'index (runs[i]) and the field, and writes nothing.';

REVOKE ALL ON FUNCTION runrow.finish_runs(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.finish_runs(jsonb) TO runrow_worker;
