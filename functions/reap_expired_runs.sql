CREATE OR REPLACE FUNCTION runrow.reap_expired_runs(grace_seconds integer DEFAULT 30, max_runs integer DEFAULT 100)
RETURNS TABLE (run_id uuid, outcome text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    orphan record;
    result text;
BEGIN
    -- The helpers only raise: called only when a test here fails, as in _claim.
    IF reap_expired_runs.grace_seconds IS NULL OR reap_expired_runs.grace_seconds NOT BETWEEN 0 AND 86400 THEN
        PERFORM runrow._require_range(reap_expired_runs.grace_seconds, 'grace_seconds', 0, 86400);
    END IF;
    IF reap_expired_runs.max_runs IS NULL OR reap_expired_runs.max_runs NOT BETWEEN 1 AND 10000 THEN
        PERFORM runrow._require_range(reap_expired_runs.max_runs, 'max_runs', 1, 10000);
    END IF;

    -- The read: candidates as they looked a moment ago. Nothing here is trusted; each
    -- reap below re-checks token, status and lease expiry inside its own write.
    -- SKIP LOCKED: a row someone holds right now is left for the next pass. Waiting on it
    -- would let one holder frozen inside its transaction (a paused worker, a host cut off
    -- mid-flush) stall every reaper of the fleet behind that one lock; PostgreSQL ends such
    -- a session after its idle_in_transaction_session_timeout and a later pass takes the run.
    -- The batch (the oldest leases) is reaped in tenant order: a reap charges its call's
    -- reservation under the tenant's budget row (_charge_usage, _tenant_unreserve), held to the
    -- end of the pass, and two passes taking those rows in lease order took them crosswise, one
    -- dying on 40P01 with its whole pass rolled back (the review of session 59). A sort of the
    -- batch, no extra statement when nothing is reserved.
    FOR orphan IN
        SELECT batch.id, batch.claim_token
        FROM (
            SELECT a.id, a.claim_token, a.fairness_key
            FROM runrow.agent_run AS a
            WHERE a.status = 'running'
              AND a.claim_expires_at < now() - make_interval(secs => reap_expired_runs.grace_seconds)
            ORDER BY a.claim_expires_at
            LIMIT reap_expired_runs.max_runs
            FOR NO KEY UPDATE SKIP LOCKED
        ) AS batch
        ORDER BY batch.fairness_key, batch.id
    LOOP
        result := runrow._end_claim(
            orphan.id, orphan.claim_token,
            format('lease expired: no heartbeat for more than the lease + %s s grace', reap_expired_runs.grace_seconds),
            reap_expired_runs.grace_seconds, NULL);
        IF result IS NOT NULL THEN
            run_id := orphan.id;
            outcome := result;
            RETURN NEXT;
        END IF;
    END LOOP;
END
$fn$;

COMMENT ON FUNCTION runrow.reap_expired_runs(integer, integer) IS
'Reap up to max_runs running runs whose lease expired more than grace_seconds ago. Safe on '
'every worker at once: each reap re-checks, inside its own UPDATE, that the run is still '
'running with the token read and that its lease is still expired beyond the grace now, so a '
'heartbeat that lands between the read and the write makes it a no-op. Never waits on a row '
'lock: a run whose row another session holds (a heartbeat or flush in flight, or a holder '
'frozen inside its transaction) is skipped and retried on the next pass. Outcome per run: '
'requeued (attempts left; claim cleared, run_requeued journaled, dispatchers woken), failed '
'(max_attempts = 1: at-most-once), dead (attempts exhausted) or cancelled (a stop was '
'pending); terminal outcomes journal complete and wake the next turn. A model call the '
'reaped attempt was granted (acquire_model_call) and never settled was billed all the same: '
'its reservation (model_call_reserved) is charged to the run''s spend, its tenant''s hour and '
'the budgets, once (the dead holder''s later append_step or record_usage is fenced out). The '
'batch is reaped in fairness_key order, so two passes charging the same tenants lock their '
'budget rows in one order and never deadlock.';

REVOKE ALL ON FUNCTION runrow.reap_expired_runs(integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.reap_expired_runs(integer, integer) TO runrow_worker;
