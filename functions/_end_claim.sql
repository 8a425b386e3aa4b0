-- The fenced hand-back shared by reap_expired_runs and release_run: in ONE statement,
-- re-check that the run is still running with the token the caller read (and, for the
-- reaper, that its lease is still expired beyond the grace *now*), then move it to
-- queued (attempts left), cancelled (a stop was requested), failed (max_attempts = 1)
-- or dead (attempts exhausted). Journals and wakes accordingly. NULL when fenced out. A reap
-- charges the reservation of the model call its holder was granted and never settled; either
-- way the reservation leaves the tenant's reserved total.
CREATE OR REPLACE FUNCTION runrow._end_claim(
    run_id uuid, claim_token uuid, error text, expired_grace_seconds integer, retry_in interval
)
RETURNS text
LANGUAGE plpgsql
AS $fn$
DECLARE
    r runrow.agent_run;
    outcome text;
    last_seq bigint;
BEGIN
    -- A reap: the holder died, maybe mid-stream. A model call it was granted and never settled
    -- was billed by the API all the same (a kill does not unsend a request), and its answer can
    -- no longer be settled (the claim is gone: append_step and record_usage are fenced out), so
    -- its reservation is charged here, once. Only this attempt's: an earlier attempt's holder
    -- handed the run back alive, its call refused or failed before any usage. Charged before the
    -- hand-back, under the row's lock and the same fence: after it a terminal run's row is
    -- sticky (the guard refuses the charge's write), and a reap of a run's last attempt failed
    -- whole, every pass of every reaper, behind it (the review of 0080).
    IF _end_claim.expired_grace_seconds IS NOT NULL THEN
        SELECT a.* INTO r FROM runrow.agent_run AS a
        WHERE a.id = _end_claim.run_id
          AND a.claim_token = _end_claim.claim_token
          AND a.claim_expires_at < now() - make_interval(secs => _end_claim.expired_grace_seconds)
        -- The reaper's own lock strength (FOR NO KEY UPDATE SKIP LOCKED): a FOR UPDATE here
        -- waited on a key-share holder (a fork_run of the run, its foreign key), and the reaper
        -- promises never to wait on a row lock (the review of stop 57).
        FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        IF r.model_call_reserved IS NOT NULL AND r.model_call_attempt = r.attempt THEN
            PERFORM runrow._charge_usage(r.id, r.model_call_reserved);
        END IF;
    END IF;

    UPDATE runrow.agent_run AS a
    SET status = CASE
            WHEN a.cancel_requested THEN 'cancelled'
            WHEN a.attempt < a.max_attempts THEN 'queued'
            WHEN a.max_attempts = 1 THEN 'failed'
            ELSE 'dead'
        END,
        finished_at = CASE WHEN a.cancel_requested OR a.attempt >= a.max_attempts THEN now() END,
        error = _end_claim.error,
        claim_token = NULL,
        claim_expires_at = NULL,
        updated_at = now(),
        -- A requeue is claimable after retry_in, or at once (a reap: the crash says nothing
        -- about the model, and the run has already waited out its lease).
        not_before = CASE
            WHEN NOT a.cancel_requested AND a.attempt < a.max_attempts THEN now() + _end_claim.retry_in
        END
    -- By primary key and token only, as heartbeat (a token means running: agent_run_state).
    WHERE a.id = _end_claim.run_id
      AND a.claim_token = _end_claim.claim_token
      AND (_end_claim.expired_grace_seconds IS NULL
           OR a.claim_expires_at < now() - make_interval(secs => _end_claim.expired_grace_seconds))
    RETURNING a.* INTO r;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- The claim is over: a call it was granted and never settled no longer holds back its
    -- tenant's other runs (migration 0088). A reap charged it above, if it was this attempt's; a
    -- release follows a call that got no answer (a 5xx, a connection lost before the response
    -- began: a response cut after it began was paid by record_usage first), which is not billed.
    -- Only a run with a grant has one (every writer that clears model_call_reserved takes the
    -- reservation out with it; a reap's charge did above): as in finish_run, a run that never
    -- reserved pays nothing here (a release_run of one read 23 shared buffers, 21 without the call).
    IF r.model_call_reserved IS NOT NULL THEN
        PERFORM runrow._tenant_unreserve(r.id);
    END IF;

    IF r.status = 'queued' THEN
        outcome := 'requeued';
        last_seq := runrow._journal(r.id, jsonb_build_array(jsonb_build_object(
            'type', 'run_requeued', 'attempt', r.attempt, 'max_attempts', r.max_attempts,
            'error', _end_claim.error) || jsonb_strip_nulls(jsonb_build_object('not_before', r.not_before))));
        PERFORM runrow._wake_tails(r.id, last_seq);
        IF r.not_before IS NULL THEN
            PERFORM runrow._wake_dispatchers(r.conversation_id);
        END IF;
    ELSE
        outcome := r.status;
        PERFORM runrow._journal_complete(r.id, r.conversation_id, r.status, NULL, _end_claim.error);
    END IF;
    RETURN outcome;
END
$fn$;

REVOKE ALL ON FUNCTION runrow._end_claim(uuid, uuid, text, integer, interval) FROM PUBLIC;
