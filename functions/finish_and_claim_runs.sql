CREATE OR REPLACE FUNCTION runrow.finish_and_claim_runs(
    runs jsonb, worker_id text DEFAULT NULL, max_runs integer DEFAULT 10, lease_seconds integer DEFAULT 30
)
-- finish_runs' columns, then claim_runs' (run_id shared): a row per element of runs with
-- finished set and the claim's columns NULL, then a row per claimed run with finished NULL.
RETURNS TABLE (
    run_id uuid,
    finished boolean,
    last_seq bigint,
    claim_token uuid,
    conversation_id uuid,
    attempt integer,
    max_attempts integer,
    model text,
    prompt_id text,
    system_prompt text,
    tools jsonb,
    user_id text,
    user_message_id uuid,
    metadata jsonb,
    claim_expires_at timestamptz,
    queued_seconds double precision
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
-- _claim's settings, for the same reasons (see functions/_claim.sql): _claim_walk runs under
-- them, and the one UPDATE below is a lookup by primary key planned once per session.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
AS $fn$
DECLARE
    who text := coalesce(finish_and_claim_runs.worker_id, 'anonymous-' || pg_backend_pid());
    ids uuid[];
    tokens uuid[];
    statuses text[];
    results jsonb[];
    errors text[];
    events jsonb[];
    locked uuid[];
    locked_since timestamptz[];
    done_ids uuid[];
    done_seqs bigint[];
    claimed_rows runrow.claimed_run[];
    -- The conversations of the runs ended here, whose next turns the walk found blocked.
    ended_convs uuid[];
    -- The runs ended here of tenants with a budget, whose reservations go (as in finish_runs).
    budgeted uuid[];
    -- The endings were written alone by finish_runs, which woke their tails (a collision).
    woken boolean := false;
    -- What made the block give up (its SQLSTATE), read only on that path.
    gave_up text;
    -- The helpers' results. A helper is called in an assignment, not in SELECT ... INTO ...
    -- FROM helper(...): an assignment whose expression reads no table is a simple expression,
    -- which PL/pgSQL evaluates itself, with no executor start-up, no function scan and no
    -- tuplestore for the one row (issue 11: -0.9% of the backend's work per run at batch 1).
    inp record;
    walk record;
BEGIN
    inp := runrow._finish_runs_input(finish_and_claim_runs.runs);
    ids := inp.ids;
    tokens := inp.tokens;
    statuses := inp.statuses;
    results := inp.results;
    errors := inp.errors;
    events := inp.events;

    BEGIN
        -- The walk locks the next runs before the endings are written, so a run's successor
        -- in its conversation is not among them: it is still blocked behind a running turn
        -- here. Claiming it in the same UPDATE would not be safe anyway (invariant 1's unique
        -- index is checked row by row, in whatever order the UPDATE visits the rows). It is
        -- claimed after this block if slots are left (below).
        walk := runrow._claim_walk(
            finish_and_claim_runs.worker_id, finish_and_claim_runs.max_runs, finish_and_claim_runs.lease_seconds
        );
        locked := walk.locked;
        locked_since := walk.locked_since;

        -- One UPDATE of agent_run ends the finished runs (fenced by their tokens exactly as
        -- finish_runs: a run whose token does not match is not updated) and claims the
        -- locked ones (exactly as _claim), and one journal INSERT writes both kinds of event:
        -- a statement, its executor start-up, agent_run's statement trigger and the CHECKs'
        -- compilation fewer than finish_runs then claim_runs. A run in both lists (queued, so
        -- its token cannot match) is claimed: its ending's row joins but does not qualify.
        -- v is both lists as rows, each with what the SET needs (a token tells an ending): a
        -- column per row, not an = ANY (locked) per SET clause and a lookup in the input's JSON
        -- by the run's id text per field (issue 11: -3% of the backend's work per run at
        -- batch 10 without events, -5% with two, python -m bench.instructions).
        WITH upd AS (
            UPDATE runrow.agent_run AS r
            SET status = CASE WHEN v.token IS NULL THEN 'running' ELSE v.status END,
                claim_token = CASE WHEN v.token IS NULL THEN gen_random_uuid() END,
                claim_expires_at = CASE WHEN v.token IS NULL
                    THEN now() + make_interval(secs => finish_and_claim_runs.lease_seconds) END,
                last_heartbeat_at = CASE WHEN v.token IS NULL THEN now() ELSE r.last_heartbeat_at END,
                worker_id = CASE WHEN v.token IS NULL THEN who ELSE r.worker_id END,
                attempt = CASE WHEN v.token IS NULL THEN r.attempt + 1 ELSE r.attempt END,
                started_at = CASE WHEN v.token IS NULL THEN coalesce(r.started_at, now()) ELSE r.started_at END,
                result = CASE WHEN v.token IS NULL THEN r.result ELSE v.result END,
                error = CASE WHEN v.token IS NULL THEN r.error ELSE v.error END,
                finished_at = CASE WHEN v.token IS NULL THEN r.finished_at ELSE now() END,
                -- Every writer stamps updated_at itself (no BEFORE trigger does, since 0030).
                updated_at = now()
            -- v: the endings, then the claims, as one function scan; a claim's row has no
            -- token (unnest pads the endings' shorter arrays with NULLs). Not a UNION ALL of a
            -- scan of each list: when a row had been updated by another transaction since this
            -- statement's snapshot (a heartbeat committing meanwhile), PostgreSQL 15's recheck
            -- of it (EvalPlanQual) through such an append never qualified, so a live run's
            -- ending came back fenced out and the run was reaped later as if its worker had
            -- died (tests/test_finish_and_claim_race.py).
            FROM unnest(
                ids || locked,
                tokens, statuses, results, errors, events,
                array_fill(NULL::timestamptz, ARRAY[coalesce(cardinality(ids), 0)]) || locked_since
            ) AS v (id, token, status, result, error, events, since)
            -- By primary key only, as in finish_runs and _claim (a status test here let the
            -- planner reach the rows through a partial index and its dead entries).
            WHERE r.id = v.id AND (v.token IS NULL OR r.claim_token = v.token)
            RETURNING r.id, r.claim_token, r.conversation_id, r.status, r.result, r.error, r.attempt,
                      r.max_attempts, r.model, r.prompt_id, r.user_id, r.user_message_id, r.metadata,
                      r.claim_expires_at, r.enqueue_seq, v.token IS NULL AS claimed, v.since, v.events,
                      r.fairness_key
        ),
        journaled AS (
            -- seq NULL: the guard trigger assigns each row the next one of its run, in this
            -- order, and RETURNING reads them back.
            -- The ending's own events, then the one event runrow writes (run_claimed or complete)
            -- as a row of its own: not appended to the events' array, which built the array
            -- again only to take it apart.
            INSERT INTO runrow.run_event (run_id, seq, type, payload)
            SELECT u.id, NULL::bigint, e.type, e.ev
            FROM upd AS u
            CROSS JOIN LATERAL (
                SELECT x.ev ->> 'type', x.ev, x.ord
                FROM jsonb_array_elements(u.events) WITH ORDINALITY AS x (ev, ord)
                UNION ALL
                SELECT CASE WHEN u.claimed THEN 'run_claimed' ELSE 'complete' END,
                       CASE WHEN u.claimed
                           THEN jsonb_build_object('type', 'run_claimed', 'worker_id', who, 'attempt', u.attempt)
                           ELSE jsonb_build_object(
                               'type', 'complete', 'status', u.status, 'result', u.result, 'error', u.error)
                       END,
                       9223372036854775807
            ) AS e (type, ev, ord)
            ORDER BY u.id, e.ord
            RETURNING run_event.run_id, run_event.seq
        ),
        -- Every ended run has journal rows (its complete at least), so this is every run of upd
        -- not claimed, with its last seq.
        ended AS (
            SELECT j.run_id, max(j.seq) AS seq, u.conversation_id, u.fairness_key
            FROM journaled AS j JOIN upd AS u ON u.id = j.run_id
            WHERE NOT u.claimed
            GROUP BY j.run_id, u.conversation_id, u.fairness_key
        )
        -- Gathered, not returned, here: rows a RETURN QUERY hands over inside this block
        -- would stay returned if the statement then failed (see _claim, migration 0038). Two
        -- aggregates, not a subquery per array: each is a plan node the executor sets up on
        -- every call.
        SELECT e.ids, e.seqs, e.convs, e.budgeted, k.claimed
        INTO done_ids, done_seqs, ended_convs, budgeted, claimed_rows
        FROM (
            SELECT array_agg(d.run_id) AS ids, array_agg(d.seq) AS seqs, array_agg(d.conversation_id) AS convs,
                   array_agg(d.run_id) FILTER (WHERE b.fairness_key IS NOT NULL) AS budgeted
            FROM ended AS d
            -- The ended runs of tenants with a budget, as finish_runs finds them.
            LEFT JOIN (
                SELECT t.fairness_key FROM runrow.tenant_budget AS t WHERE EXISTS (SELECT 1 FROM runrow.tenant_budget)
            ) AS b ON b.fairness_key = d.fairness_key
        ) AS e
        CROSS JOIN (
            SELECT array_agg(ROW(
                       u.id, u.claim_token, u.conversation_id, u.attempt, u.max_attempts, u.model,
                       u.prompt_id, p.system_prompt, p.tools, u.user_id, u.user_message_id, u.metadata,
                       u.claim_expires_at, extract(EPOCH FROM now() - u.since)::double precision
                   )::runrow.claimed_run ORDER BY u.enqueue_seq) AS claimed
            FROM upd AS u
            JOIN runrow.prompt AS p ON p.id = u.prompt_id
            WHERE u.claimed
        ) AS k;

        -- An ended run's call granted and never settled holds nothing back any more, as in
        -- finish_runs: its reservation goes, under its tenant's budget row. That row is not waited
        -- for here, where the walk's rows are held: a reap or a grant of the tenant holds it and
        -- then wants a turn the walk locked (an ended run's next one, whose mark its ending
        -- clears), and the call died on 40P01 with its whole flush (the review of session 60). A
        -- row held elsewhere gives the block up (NOWAIT: 55P03), and the endings are written
        -- alone, as finish_runs writes them: the run rows, then the budget rows, waited for
        -- with no walked turn held; the claim follows (below).
        IF budgeted IS NOT NULL THEN
            PERFORM 1 FROM runrow.tenant_budget AS b
            WHERE b.fairness_key IN (
                SELECT s.fairness_key FROM runrow.tenant_reservation AS s WHERE s.run_id = ANY (budgeted)
            )
            ORDER BY b.fairness_key
            FOR UPDATE NOWAIT;
            -- The rows locked, the helper takes the reservations out (its lock waits for nothing).
            IF FOUND THEN
                PERFORM runrow._tenant_unreserve_runs(budgeted);
            END IF;
        END IF;
    EXCEPTION WHEN unique_violation OR serialization_failure OR check_violation OR deadlock_detected
        OR lock_not_available THEN
        GET STACKED DIAGNOSTICS gave_up = RETURNED_SQLSTATE;
        -- Whatever collided (a claim's, as _claim catches them, or an ending's), the block's
        -- writes and locks are gone: the endings are written alone, as finish_runs writes
        -- them, and nothing is claimed this round. An error of an ending's own recurs there
        -- and reaches the caller as finish_runs raises it. finish_runs has woken the tails;
        -- ended_convs and claimed_rows stay NULL, so nothing below claims or wakes again.
        -- A deadlock too: the walk marks the queued turns it finds blocked before the block's
        -- endings lock their runs' next turns, so two calls that each marked the next turn of
        -- a run the other ends wait on each other. The loser's marks go with its block, and
        -- finish_runs walks nothing (tests/test_finish_and_claim_deadlock.py).
        -- The block's claims are gone with it (the variables it set are not).
        ended_convs := NULL;
        claimed_rows := NULL;
        SELECT array_agg(f.run_id) FILTER (WHERE f.finished), array_agg(f.last_seq) FILTER (WHERE f.finished)
        INTO done_ids, done_seqs
        FROM runrow.finish_runs(finish_and_claim_runs.runs) AS f;
        woken := true;
    END;

    -- A budget row held elsewhere is no collision of the claim's: with the endings written,
    -- claim as claim_runs would (_claim never waits for a row: SKIP LOCKED), so a budgeted
    -- tenant's worker does not go a round without work for a grant in flight.
    IF gave_up = '55P03' THEN
        claimed_rows := ARRAY(
            SELECT c FROM runrow._claim(
                finish_and_claim_runs.worker_id, finish_and_claim_runs.max_runs, finish_and_claim_runs.lease_seconds
            ) AS c
        );
    END IF;

    -- A conversation's next turn queued behind a run ended here was blocked when the walk
    -- ran. If the walk left slots free, claim what is claimable now that the endings are
    -- written, as claim_runs after finish_runs would: a second claiming statement, paid only
    -- when such a turn exists (one probe by conversation, and none while the walk filled
    -- every slot, the common case under load).
    -- Two IFs, not one: an IF whose condition holds a subquery starts the subquery's plan on
    -- every call, even when the tests before it settle the IF (the cheap tests alone are a
    -- simple expression, which PL/pgSQL evaluates without starting a plan).
    IF ended_convs IS NOT NULL AND coalesce(cardinality(claimed_rows), 0) < finish_and_claim_runs.max_runs THEN
        IF EXISTS (
            SELECT 1 FROM runrow.agent_run AS n
            WHERE n.conversation_id = ANY (ended_convs) AND n.status = 'queued'
        ) THEN
            claimed_rows := coalesce(claimed_rows, '{}') || ARRAY(
                SELECT c FROM runrow._claim(
                    finish_and_claim_runs.worker_id,
                    finish_and_claim_runs.max_runs - coalesce(cardinality(claimed_rows), 0),
                    finish_and_claim_runs.lease_seconds
                ) AS c
            );
        END IF;
    END IF;

    -- The wakes, as finish_runs sends them: each ended run's tails, if a tail watches it (the
    -- helper is called only then, as in finish_runs).
    IF done_ids IS NOT NULL AND NOT woken AND (
        current_setting('transaction_isolation') <> 'read committed'
        OR EXISTS (SELECT 1 FROM runrow.run_watch AS w WHERE w.run_id = ANY (done_ids))
    ) THEN
        PERFORM runrow._wake_tails_ended_batch(done_ids, done_seqs);
    END IF;

    RETURN QUERY
    SELECT x.id, d.seq IS NOT NULL, d.seq, NULL::uuid, NULL::uuid, NULL::integer,
           NULL::integer, NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::text, NULL::uuid, NULL::jsonb,
           NULL::timestamptz, NULL::double precision
    -- ids is the input's order, already parsed: the JSON is not read again.
    FROM unnest(ids) WITH ORDINALITY AS x (id, ord)
    LEFT JOIN unnest(done_ids, done_seqs) AS d (id, seq) ON d.id = x.id
    ORDER BY x.ord;
    RETURN QUERY
    SELECT c.run_id, NULL::boolean, NULL::bigint, c.claim_token, c.conversation_id, c.attempt, c.max_attempts,
           c.model, c.prompt_id, c.system_prompt, c.tools, c.user_id, c.user_message_id, c.metadata,
           c.claim_expires_at, c.queued_seconds
    FROM unnest(claimed_rows) AS c;
END
$fn$;

COMMENT ON FUNCTION runrow.finish_and_claim_runs(jsonb, text, integer, integer) IS
'finish_runs(runs) and claim_runs(worker_id, max_runs, lease_seconds) in one call and one '
'UPDATE: each run of runs is fenced and ended exactly as finish_runs ends it (a run fenced out '
'writes nothing, the others proceed; same journal, same wakes), and up to max_runs (1..1000) '
'runs are claimed with exactly the rules of claim_runs. The claim is chosen before the endings '
'are written; the next turn of a conversation ended here is claimed after them, in the same '
'call, when slots are left (otherwise the ending wakes the dispatchers for it). Returns a row per element of runs, in input order, with '
'finished and last_seq as finish_runs and the claim columns NULL; then a row per claimed run '
'with claim_runs'' columns and finished NULL. A claim that collides with another claimer, or a '
'call that deadlocks with another, claims nothing and the endings are written alone. An ended run''s '
'reservation goes under its tenant''s budget row, never waited for while the claim''s rows are held: '
'if another session holds it, the endings are written alone (as finish_runs, waiting for it) and the '
'claim follows them. Bad input raises as finish_runs and claim_runs do '
'(22004/22023 naming runs[i] and the field, or the argument) and writes nothing.';

REVOKE ALL ON FUNCTION runrow.finish_and_claim_runs(jsonb, text, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.finish_and_claim_runs(jsonb, text, integer, integer) TO runrow_worker;
