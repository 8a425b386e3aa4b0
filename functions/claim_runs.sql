CREATE OR REPLACE FUNCTION runrow.claim_runs(
    worker_id text DEFAULT NULL, max_runs integer DEFAULT 10, lease_seconds integer DEFAULT 30
)
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
    RETURN QUERY SELECT * FROM runrow._claim(claim_runs.worker_id, claim_runs.max_runs, claim_runs.lease_seconds);
END
$fn$;

COMMENT ON FUNCTION runrow.claim_runs(text, integer, integer) IS
'Claim up to max_runs (1..1000) runs in one statement with exactly the rules of claim_run: '
'claim order (priority, fair across tenants, arrival), delays and concurrency limits, SKIP LOCKED, at most one turn per conversation (only the oldest queued turn '
'of a conversation is claimable), fresh token and lease each, run_claimed journaled. One '
'call, one transaction: a worker with several free slots fills them without one commit per run. '
'queued_seconds as for claim_run.';

REVOKE ALL ON FUNCTION runrow.claim_runs(text, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.claim_runs(text, integer, integer) TO runrow_worker;
