-- The claim itself, shared by claim_run and claim_runs.
CREATE OR REPLACE FUNCTION runrow._claim(worker_id text, max_runs integer, lease_seconds integer)
RETURNS TABLE (
    run_id uuid,
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
SET search_path = pg_catalog, runrow
-- Every statement here has one sensible plan whatever its parameters (see below), so plan it
-- once per session: PL/pgSQL otherwise plans the first calls anew, and keeps doing so for the
-- final UPDATE ... = ANY (locked) (custom plans look cheaper than the generic one), which cost
-- more than the claim itself (measured: 1.42 -> 1.00 ms per one-run claim).
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    who text := coalesce(_claim.worker_id, 'anonymous-' || pg_backend_pid());
    cand record;
    got uuid;
    after_seq bigint := 0;
    locked uuid[] := '{}';
    blocked boolean;
    -- The re-check under the lock relies on each statement's fresh snapshot, which only
    -- READ COMMITTED gives; a claim inside a REPEATABLE READ or SERIALIZABLE transaction
    -- skips blocked turns without marking them.
    may_mark boolean := current_setting('transaction_isolation') = 'read committed';
BEGIN
    IF _claim.worker_id = '' OR length(_claim.worker_id) > 200 THEN
        RAISE EXCEPTION 'worker_id must be NULL or 1 to 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM runrow._require_range(_claim.max_runs, 'max_runs', 1, 1000);
    PERFORM runrow._require_range(_claim.lease_seconds, 'lease_seconds', 1, 3600);

    BEGIN
        -- Walk the queue one run at a time instead of one statement with the checks as
        -- filters: a filtered "ORDER BY ... LIMIT n" is planned from the estimated share of
        -- rows that pass the filters, so fresh statistics of a long queue made the planner
        -- sort the whole queue (and run both checks on every row), and stale ones of an empty
        -- queue turned the checks into anti joins over whole indexes. Each statement below
        -- has one sensible plan whatever the statistics: an ordered LIMIT 1 step, two probes
        -- by conversation, a point lock. Every statement takes a fresh snapshot, which only
        -- makes the checks see more recent commits; the unique index and the turn-order
        -- trigger stay the guarantee. Rows are locked to be claimed, or, when blocked, to be
        -- marked claim_blocked once (so the walk never reads them again).
        WHILE cardinality(locked) < _claim.max_runs LOOP
            -- The next queued run in claim order: agent_run_claimable (status = 'queued' and
            -- not claim_blocked, enqueue_seq). No other filter, so LIMIT 1 is one index step,
            -- never a sort, and turns marked blocked are never read (migration 0021).
            SELECT q.id, q.conversation_id, q.enqueue_seq INTO cand
            FROM runrow.agent_run AS q
            WHERE q.status = 'queued' AND NOT q.claim_blocked AND q.enqueue_seq > after_seq
            ORDER BY q.enqueue_seq
            LIMIT 1;
            EXIT WHEN NOT FOUND;
            after_seq := cand.enqueue_seq;

            -- Invariant 1 pre-filter (the unique index is the guarantee): served by that
            -- unique index, agent_run_one_active_per_conversation. Turn order: only the
            -- oldest open turn of a conversation (with the first probe, the oldest queued
            -- one). A turn locked by another claimer is still queued until that claim
            -- commits, so its successor is never taken instead of it; one we locked
            -- ourselves is still queued too, so one call takes one turn per conversation.
            -- status IN (...) matches agent_run_open_by_conversation alone, not
            -- agent_run_claimable, so the probe never walks the queue.
            blocked := EXISTS (
                SELECT 1 FROM runrow.agent_run AS a
                WHERE a.conversation_id = cand.conversation_id
                  AND a.status IN ('running', 'waiting')
            ) OR EXISTS (
                SELECT 1 FROM runrow.agent_run AS o
                WHERE o.conversation_id = cand.conversation_id
                  AND o.status IN ('queued', 'running', 'waiting')
                  AND o.enqueue_seq < cand.enqueue_seq
            );
            CONTINUE WHEN blocked AND NOT may_mark;
            -- The lock: one row, skipped if another claimer (or the trigger that unblocks
            -- a turn) holds it, re-checked (still queued) once locked. Every index whose
            -- predicate this WHERE implies has a column of it as key (not so for id:
            -- agent_run_claimable would qualify with no key to descend), so any plan is a
            -- point lookup.
            SELECT q.id INTO got
            FROM runrow.agent_run AS q
            WHERE q.conversation_id = cand.conversation_id
              AND q.enqueue_seq = cand.enqueue_seq
              AND q.status = 'queued'
            FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
            IF blocked THEN
                -- Mark it so no later claim reads it again, but only if it is still blocked
                -- now that we hold its lock: these probes take a fresh snapshot, so a turn
                -- ahead that ended before we locked is seen ended, and one that ends after
                -- waits for our lock in agent_run_unblock_next_turn and clears the mark.
                blocked := EXISTS (
                    SELECT 1 FROM runrow.agent_run AS a
                    WHERE a.conversation_id = cand.conversation_id
                      AND a.status IN ('running', 'waiting')
                ) OR EXISTS (
                    SELECT 1 FROM runrow.agent_run AS o
                    WHERE o.conversation_id = cand.conversation_id
                      AND o.status IN ('queued', 'running', 'waiting')
                      AND o.enqueue_seq < cand.enqueue_seq
                );
                IF blocked THEN
                    UPDATE runrow.agent_run AS q SET claim_blocked = true WHERE q.id = got;
                    CONTINUE;
                END IF;
            END IF;
            locked := locked || got;
        END LOOP;

        RETURN QUERY
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
                started_at = coalesce(r.started_at, now())
            -- q: the row as it was queued (the statement's snapshot), for the time it waited.
            FROM runrow.agent_run AS q
            WHERE r.id = ANY (locked) AND q.id = r.id
            RETURNING r.*, extract(EPOCH FROM now() - q.updated_at)::double precision AS queued_seconds
        ),
        journaled AS (
            INSERT INTO runrow.run_event (run_id, seq, type, payload)
            SELECT cl.id,
                   (SELECT coalesce(max(e.seq), 0) + 1 FROM runrow.run_event AS e WHERE e.run_id = cl.id),
                   'run_claimed',
                   jsonb_build_object('type', 'run_claimed', 'worker_id', who, 'attempt', cl.attempt)
            FROM claimed AS cl
        )
        SELECT cl.id, cl.claim_token, cl.conversation_id, cl.attempt, cl.max_attempts, cl.model,
               cl.prompt_id, p.system_prompt, p.tools, cl.user_id, cl.user_message_id, cl.metadata,
               cl.claim_expires_at, cl.queued_seconds
        FROM claimed AS cl
        JOIN runrow.prompt AS p ON p.id = cl.prompt_id
        ORDER BY cl.enqueue_seq;
    EXCEPTION WHEN unique_violation OR serialization_failure THEN
        -- A collision with invariant 1 (or the turn-order guard) claims nothing this
        -- round (the subtransaction's row locks go with it); the turns stay queued for the
        -- next pass. No error reaches the caller.
        RETURN;
    END;
END
$fn$;

REVOKE ALL ON FUNCTION runrow._claim(text, integer, integer) FROM PUBLIC;
