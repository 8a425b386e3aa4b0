CREATE OR REPLACE FUNCTION runrow.defer_run(run_id uuid, claim_token uuid, retry_in interval, reason text)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    r runrow.agent_run;
    last_seq bigint;
BEGIN
    PERFORM runrow._require_not_null(defer_run.run_id, 'run_id');
    PERFORM runrow._require_not_null(defer_run.claim_token, 'claim_token');
    PERFORM runrow._require_not_null(defer_run.retry_in, 'retry_in');
    PERFORM runrow._require_not_null(defer_run.reason, 'reason');
    PERFORM runrow._require_delay(defer_run.retry_in, 'retry_in', interval '1 day');
    IF defer_run.reason !~ '[^[:space:]]' OR length(defer_run.reason) > 10000 THEN
        RAISE EXCEPTION 'reason must be 1 to 10000 characters, not only white space'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- release_run's hand-back, but the attempt is given back, as parking gives it back: a wait
    -- for a fleet limit is not the run failing. release_run spent it, so a run on its last
    -- attempt (every max_attempts = 1 run) that had to wait out a rate limit ended failed.
    -- A stop requested meanwhile wins, as in release_run.
    UPDATE runrow.agent_run AS a
    SET status = CASE WHEN a.cancel_requested THEN 'cancelled' ELSE 'queued' END,
        attempt = CASE WHEN a.cancel_requested THEN a.attempt ELSE a.attempt - 1 END,
        finished_at = CASE WHEN a.cancel_requested THEN now() END,
        error = defer_run.reason,
        claim_token = NULL,
        claim_expires_at = NULL,
        not_before = CASE WHEN NOT a.cancel_requested THEN now() + defer_run.retry_in END,
        updated_at = now()
    -- By primary key and token only, as release_run (a token means running: agent_run_state).
    WHERE a.id = defer_run.run_id AND a.claim_token = defer_run.claim_token
    RETURNING a.* INTO r;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;

    IF r.status = 'cancelled' THEN
        PERFORM runrow._journal_complete(r.id, r.conversation_id, r.status, NULL, defer_run.reason);
        RETURN 'cancelled';
    END IF;
    last_seq := runrow._journal(r.id, jsonb_build_array(jsonb_build_object(
        'type', 'run_requeued', 'attempt', r.attempt, 'max_attempts', r.max_attempts,
        'error', defer_run.reason, 'not_before', r.not_before, 'deferred', true)));
    PERFORM runrow._wake_tails(r.id, last_seq);
    RETURN 'deferred';
END
$fn$;

COMMENT ON FUNCTION runrow.defer_run(uuid, uuid, interval, text) IS
'A worker hands back a run that must wait for a fleet limit (a rate-limited or blocked '
'rate_limit_key, as acquire_model_call said), without spending an attempt: queued again with its '
'attempt given back, not claimable before now() + retry_in (more than 0, at most 1 day), reason '
'kept as its error and journaled in run_requeued (with not_before and deferred = true); no wake '
'is sent. Fenced by claim_token and status running. Returns deferred, or cancelled (a stop was '
'pending; complete journaled), or NULL when fenced out (nothing written). Bad input (a NULL '
'argument, retry_in out of range, a reason empty, of white space only or over 10000 characters) '
'raises 22004/22023 naming it and writes nothing.';

REVOKE ALL ON FUNCTION runrow.defer_run(uuid, uuid, interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.defer_run(uuid, uuid, interval, text) TO runrow_worker;
