-- The claim itself, shared by claim_run and claim_runs: _claim_walk locks the runs, one
-- statement here claims them and journals run_claimed.
CREATE OR REPLACE FUNCTION runrow._claim(worker_id text, max_runs integer, lease_seconds integer)
-- One row per claimed run, as claim_run and claim_runs return it (migration 0038).
RETURNS SETOF runrow.claimed_run
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow, pg_temp
-- Every statement here has one sensible plan whatever its parameters (see below), so plan it
-- once per session: PL/pgSQL otherwise plans the first calls anew, which cost more than the
-- claim itself (measured: 1.42 -> 1.00 ms per one-run claim), for the final UPDATE ... = ANY
-- (locked) above all (custom plans look cheaper than the generic one). _claim_walk runs
-- under these settings too.
SET plan_cache_mode = force_generic_plan
-- Plans must not depend on how big agent_run looked when the session first claimed: they are
-- generic and kept for the session, until an ANALYZE or VACUUM of the table. A worker that
-- starts on a new table (never analyzed: the planner assumes 10 pages) cached two plans that
-- read the whole table, the promotion of due delayed runs and the final UPDATE by primary key,
-- and every later claim in that session read all of it: 700 buffers for a one-run claim at
-- 6,000 runs, against 161 at 6,000 or 16,000 with these settings (tests/test_claim_cost.py
-- counts the seq scans). So no seq scan where an index serves. A statement with no usable
-- index still seq-scans, at a nominal cost of 1e10; without jit = off that cost would make
-- each such call JIT-compile (29 ms, measured).
SET enable_seqscan = off
-- Likewise no sort where an index gives the order: every ordered read of agent_run here is a
-- walk of the index whose key is that order (agent_run_claimable, agent_run_delayed). On
-- statistics taken while the queue was nearly empty, every partial index of queued runs looks
-- one row long, and a sort of another such index's whole range looked as cheap as
-- agent_run_delayed's first entry: the look for a due delayed run read the whole queue on
-- every claim (3,000 buffers at 3,000 queued runs; tests/test_claim_cost.py). The one sort
-- left, the claimed rows' ORDER BY, has no alternative and is kept.
SET enable_sort = off
SET jit = off
AS $fn$
DECLARE
    who text := coalesce(_claim.worker_id, 'anonymous-' || pg_backend_pid());
    locked uuid[];
    -- When each run in locked (parallel array) was queued.
    locked_since timestamptz[];
    -- The claimed rows, returned once the statement that claims them has succeeded.
    claimed_rows runrow.claimed_run[];
    -- The walk's result, read as a simple expression (see finish_and_claim_runs).
    walk record;
BEGIN
    BEGIN
        -- The walk writes (promotions, blocked marks, tenant clocks) inside this block, so a
        -- collision of the claiming statement below takes them back with its own writes.
        walk := runrow._claim_walk(_claim.worker_id, _claim.max_runs, _claim.lease_seconds);
        locked := walk.locked;
        locked_since := walk.locked_since;

        -- Nothing locked, nothing to write: an UPDATE that matches no row still fires
        -- agent_run's statement trigger and starts an executor for the whole statement, and
        -- empty claims are the common ones in a fleet (every idle worker woken by an enqueue
        -- but the one that takes it).
        IF cardinality(locked) = 0 THEN
            RETURN;
        END IF;

        -- Gathered, not returned, here: rows a RETURN QUERY has handed over stay returned
        -- when the statement then fails and the handler below catches it, and the journal
        -- INSERT and agent_run's statement trigger run after the rows are out. So a claim the
        -- handler rolls back would have returned runs nobody holds (migration 0038).
        WITH claimed AS (
            -- By primary key alone: every row is locked by us and was re-checked queued
            -- when locked, so nobody changed it since. A status filter here would let the
            -- planner reach the rows through a partial index scan instead of the key.
            UPDATE runrow.agent_run AS r
            SET status = 'running',
                claim_token = gen_random_uuid(),
                claim_expires_at = now() + make_interval(secs => _claim.lease_seconds),
                last_heartbeat_at = now(),
                worker_id = who,
                attempt = r.attempt + 1,
                started_at = coalesce(r.started_at, now()),
                -- Every writer stamps updated_at itself (no BEFORE trigger does, since 0030).
                updated_at = now()
            WHERE r.id = ANY (locked)
            RETURNING r.id, r.claim_token, r.conversation_id, r.attempt, r.max_attempts, r.model, r.prompt_id,
                      r.user_id, r.user_message_id, r.metadata, r.claim_expires_at, r.enqueue_seq
        ),
        journaled AS (
            -- seq NULL: the guard trigger assigns the next one (its lookup is the only one).
            INSERT INTO runrow.run_event (run_id, seq, type, payload)
            SELECT cl.id,
                   NULL,
                   'run_claimed',
                   jsonb_build_object('type', 'run_claimed', 'worker_id', who, 'attempt', cl.attempt)
            FROM claimed AS cl
        )
        SELECT array_agg(ROW(
                   cl.id, cl.claim_token, cl.conversation_id, cl.attempt, cl.max_attempts, cl.model,
                   cl.prompt_id, p.system_prompt, p.tools, cl.user_id, cl.user_message_id, cl.metadata,
                   cl.claim_expires_at, extract(EPOCH FROM now() - w.since)::double precision
               )::runrow.claimed_run ORDER BY cl.enqueue_seq)
        INTO claimed_rows
        FROM claimed AS cl
        JOIN runrow.prompt AS p ON p.id = cl.prompt_id
        JOIN unnest(locked, locked_since) AS w (id, since) ON w.id = cl.id;
    EXCEPTION WHEN unique_violation OR serialization_failure OR check_violation THEN
        -- A collision with invariant 1, the turn-order guard, a concurrency limit (which
        -- the checks above make rare: each is pre-checked under the lock that keeps it true)
        -- or a journal row written meanwhile claims nothing this round (the
        -- subtransaction's row locks go with it); the turns stay queued for the next pass.
        -- No error reaches the caller, and no run: claimed_rows is still empty.
        RETURN;
    END;
    RETURN QUERY SELECT * FROM unnest(claimed_rows);
END
$fn$;

REVOKE ALL ON FUNCTION runrow._claim(text, integer, integer) FROM PUBLIC;
