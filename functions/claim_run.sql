CREATE OR REPLACE FUNCTION runrow.claim_run(worker_id text DEFAULT NULL, lease_seconds integer DEFAULT 30)
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
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    -- PL/pgSQL, not SQL: an SQL function that carries SET cannot be inlined, and is then
    -- parsed and planned anew on every call; this one plans its statement once per session.
    RETURN QUERY SELECT * FROM runrow._claim(claim_run.worker_id, 1, claim_run.lease_seconds);
END
$fn$;

COMMENT ON FUNCTION runrow.claim_run(text, integer) IS
'Claim zero or one run. The first claimable queued run in claim order (highest priority, '
'then the least recently served tenant by weighted virtual clock, then enqueue order; FOR '
'UPDATE SKIP LOCKED), due (not_before passed), of no concurrency key at its limit, whose conversation has no running or waiting run and no earlier queued '
'turn, becomes running with a fresh claim_token, a lease of lease_seconds (1..3600) on the '
'database clock, the worker and attempt + 1, and journals run_claimed. Returns what the '
'worker needs to run it, including the pinned model, system prompt and tools. A collision '
'with the one-active-run-per-conversation index claims nothing instead of raising. '
'worker_id NULL means anonymous-<backend pid>. queued_seconds: how long the run waited since it '
'last became claimable (enqueued, requeued, approved, or the turn ahead of it ended), on the '
'database clock: the enqueue-to-claim latency.';

REVOKE ALL ON FUNCTION runrow.claim_run(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.claim_run(text, integer) TO runrow_worker;
