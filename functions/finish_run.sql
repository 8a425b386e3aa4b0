CREATE OR REPLACE FUNCTION runrow.finish_run(
    run_id uuid, claim_token uuid, status text, result jsonb DEFAULT NULL, error text DEFAULT NULL
)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow, pg_temp
SECURITY DEFINER
AS $fn$
DECLARE
    conv uuid;
    journaled bigint;
    reserved boolean;
BEGIN
    -- The helpers only raise (the first failing one, in this order): called only when a test
    -- here fails, not as a statement and a search_path switch each on every call.
    IF finish_run.run_id IS NULL
       OR finish_run.claim_token IS NULL
       OR finish_run.status IS NULL THEN
        PERFORM runrow._require_not_null(finish_run.run_id, 'run_id');
        PERFORM runrow._require_not_null(finish_run.claim_token, 'claim_token');
        PERFORM runrow._require_not_null(finish_run.status, 'status');
    END IF;
    IF finish_run.status NOT IN ('completed', 'failed', 'cancelled') THEN
        -- Quoted below: a control character would reach the log through the error.
        PERFORM runrow._require_printable(finish_run.status, 'status');
        RAISE EXCEPTION 'status must be one of completed, failed, cancelled, got "%"', left(finish_run.status, 80)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(finish_run.result::text) > 1048576 THEN
        RAISE EXCEPTION 'result is too large: the limit is 1 MiB' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- agent_run_result_portable's rule, named here (its webhook payload and GET /runs/{id} must
    -- be readable by every JSON client).
    IF NOT runrow._json_portable(finish_run.result) THEN
        PERFORM runrow._require_portable_json(finish_run.result, 'result');
    END IF;
    IF length(finish_run.error) > 10000 THEN
        RAISE EXCEPTION 'error is too long: at most 10000 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The fenced terminal write: whoever ends the run first wins; terminal is sticky.
    UPDATE runrow.agent_run AS r
    SET status = finish_run.status,
        result = finish_run.result,
        error = finish_run.error,
        finished_at = now(),
        claim_token = NULL,
        claim_expires_at = NULL,
        -- Every writer stamps updated_at itself (no BEFORE trigger does, since 0030).
        updated_at = now()
    -- By primary key and token only, as heartbeat (a token means running: agent_run_state).
    WHERE r.id = finish_run.run_id
      AND r.claim_token = finish_run.claim_token
    RETURNING r.conversation_id, r.model_call_reserved IS NOT NULL INTO conv, reserved;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- A call granted and never settled (the API refused it: the run fails) holds nothing back
    -- any more: its reservation leaves the tenant's total. Only then: a run without one pays
    -- nothing here (tests/test_lifecycle_calls.py).
    IF reserved THEN
        PERFORM runrow._tenant_unreserve(finish_run.run_id);
    END IF;

    -- An assignment, not a PERFORM: no statement of its own (see enqueue_run).
    journaled := runrow._journal_complete(
        finish_run.run_id, conv, finish_run.status, finish_run.result, finish_run.error
    );
    RETURN true;
END
$fn$;

COMMENT ON FUNCTION runrow.finish_run(uuid, uuid, text, jsonb, text) IS
'The worker''s fenced terminal write: status completed, failed or cancelled, with an optional '
'result (JSON, at most 1 MiB, that every JSON client reads back: under 100 levels, numbers within '
'a double''s range; else 22023 naming result) and error text. Only while claim_token matches and the run is '
'running; clears the claim, journals the one terminal complete event (with status, result, '
'error), NOTIFYs the run''s tails if one watches it (watch_runs) and runrow_enqueued if the '
'ending lets a run start (a queued next turn, a capped key, a webhook delivery). '
'Returns false, writing nothing, when someone else already ended the run.';

REVOKE ALL ON FUNCTION runrow.finish_run(uuid, uuid, text, jsonb, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.finish_run(uuid, uuid, text, jsonb, text) TO runrow_worker;
