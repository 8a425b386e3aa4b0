CREATE OR REPLACE FUNCTION runrow.heartbeat(run_id uuid, claim_token uuid, lease_seconds integer DEFAULT 30)
RETURNS TABLE (owned boolean, cancel_requested boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    flag boolean;
BEGIN
    -- The helpers only raise (the first failing one, in this order): called only when a test
    -- here fails, not as a statement and a search_path switch each on every call.
    IF heartbeat.run_id IS NULL
       OR heartbeat.claim_token IS NULL
       OR heartbeat.lease_seconds IS NULL OR heartbeat.lease_seconds NOT BETWEEN 1 AND 3600 THEN
        PERFORM runrow._require_not_null(heartbeat.run_id, 'run_id');
        PERFORM runrow._require_not_null(heartbeat.claim_token, 'claim_token');
        PERFORM runrow._require_range(heartbeat.lease_seconds, 'lease_seconds', 1, 3600);
    END IF;

    -- Touches only unindexed columns, so this is a HOT update.
    UPDATE runrow.agent_run AS r
    SET claim_expires_at = now() + make_interval(secs => heartbeat.lease_seconds),
        last_heartbeat_at = now(),
        -- Every writer stamps updated_at itself (unindexed too; no BEFORE trigger does, since 0030).
        updated_at = now()
    -- By primary key and token only: a token is set exactly while the run is running
    -- (agent_run_state), and a status test let the planner scan the whole partial index of
    -- active turns instead, every running run's entry per beat (tests/test_fence_plans.py).
    WHERE r.id = heartbeat.run_id
      AND r.claim_token = heartbeat.claim_token
    RETURNING r.cancel_requested INTO flag;

    IF FOUND THEN
        -- The row as OUT values and RETURN NEXT, not RETURN QUERY SELECT: a row of values needs
        -- no statement (issue 11; a heartbeat is the call a long run makes most).
        owned := true;
        cancel_requested := flag;
        RETURN NEXT;
    ELSE
        -- Fenced out: not an error. The caller lost the run and must stand down.
        RETURN QUERY SELECT false, coalesce(
            (SELECT r.cancel_requested FROM runrow.agent_run AS r WHERE r.id = heartbeat.run_id), false);
    END IF;
END
$fn$;

COMMENT ON FUNCTION runrow.heartbeat(uuid, uuid, integer) IS
'Extend the lease to now() + lease_seconds (1..3600) while claim_token matches and the run '
'is running; the token never rotates. owned = false (nothing written) tells a zombie it lost '
'the run: it was reaped, released, finished, parked or never held with this token. '
'cancel_requested doubles as the cancel poll for a worker that missed the NOTIFY.';

REVOKE ALL ON FUNCTION runrow.heartbeat(uuid, uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.heartbeat(uuid, uuid, integer) TO runrow_worker;
