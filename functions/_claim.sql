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
    claim_expires_at timestamptz
)
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    who text := coalesce(_claim.worker_id, 'anonymous-' || pg_backend_pid());
BEGIN
    IF _claim.worker_id = '' OR length(_claim.worker_id) > 200 THEN
        RAISE EXCEPTION 'worker_id must be NULL or 1 to 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM runrow._require_range(_claim.max_runs, 'max_runs', 1, 1000);
    PERFORM runrow._require_range(_claim.lease_seconds, 'lease_seconds', 1, 3600);

    BEGIN
        RETURN QUERY
        WITH candidate AS MATERIALIZED (
            -- The fence against over-locking: LIMIT and SKIP LOCKED apply here, inside a
            -- materialized CTE the planner cannot flatten into the UPDATE. Served by
            -- agent_run_claimable (status = 'queued' ORDER BY enqueue_seq).
            SELECT q.id
            FROM runrow.agent_run AS q
            WHERE q.status = 'queued'
              -- Invariant 1 pre-filter (the unique index is the guarantee).
              AND NOT EXISTS (
                  SELECT 1 FROM runrow.agent_run AS a
                  WHERE a.conversation_id = q.conversation_id
                    AND a.status IN ('running', 'waiting')
              )
              -- Turn order: only the oldest queued turn of a conversation. A turn locked
              -- by another claimer is still queued in this snapshot, so its successor is
              -- never taken instead of it.
              AND NOT EXISTS (
                  SELECT 1 FROM runrow.agent_run AS e
                  WHERE e.conversation_id = q.conversation_id
                    AND e.status = 'queued'
                    AND e.enqueue_seq < q.enqueue_seq
              )
            ORDER BY q.enqueue_seq
            LIMIT _claim.max_runs
            FOR UPDATE SKIP LOCKED
        ),
        claimed AS (
            UPDATE runrow.agent_run AS r
            SET status = 'running',
                claim_token = gen_random_uuid(),
                claim_expires_at = now() + make_interval(secs => _claim.lease_seconds),
                last_heartbeat_at = now(),
                worker_id = who,
                attempt = r.attempt + 1,
                started_at = coalesce(r.started_at, now())
            FROM candidate AS c
            WHERE r.id = c.id AND r.status = 'queued'
            RETURNING r.*
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
               cl.claim_expires_at
        FROM claimed AS cl
        JOIN runrow.prompt AS p ON p.id = cl.prompt_id
        ORDER BY cl.enqueue_seq;
    EXCEPTION WHEN unique_violation OR serialization_failure THEN
        -- A collision with invariant 1 (or the turn-order guard) claims nothing this
        -- round; the turn stays queued for the next pass. No error reaches the caller.
        RETURN;
    END;
END
$fn$;

REVOKE ALL ON FUNCTION runrow._claim(text, integer, integer) FROM PUBLIC;
