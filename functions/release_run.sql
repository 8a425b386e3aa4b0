CREATE OR REPLACE FUNCTION runrow.release_run(
    run_id uuid, claim_token uuid, error text DEFAULT NULL, retry_in interval DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    PERFORM runrow._require_not_null(release_run.run_id, 'run_id');
    PERFORM runrow._require_not_null(release_run.claim_token, 'claim_token');
    IF length(release_run.error) > 10000 THEN
        RAISE EXCEPTION 'error is too long: at most 10000 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT runrow._delay_plain(release_run.retry_in, interval '1 day') THEN
        PERFORM runrow._require_delay(release_run.retry_in, 'retry_in', interval '1 day');
    END IF;
    RETURN runrow._end_claim(
        release_run.run_id, release_run.claim_token, release_run.error, NULL, release_run.retry_in
    );
END
$fn$;

COMMENT ON FUNCTION runrow.release_run(uuid, uuid, text, interval) IS
'A worker hands back a run it cannot finish in this attempt (a transient failure, a drain). '
'Fenced by claim_token and status running. Returns requeued (attempts left: queued again at '
'once, without waiting for the lease, dispatchers woken), failed (max_attempts = 1), dead '
'(attempts exhausted) or cancelled (a stop was pending); terminal outcomes journal complete. '
'retry_in (more than 0, at most 1 day, judged where now() + retry_in lands) is the backoff: requeued but not claimable before '
'now() + retry_in, run_requeued carries not_before, and no wake is sent. '
'NULL when fenced out: nothing written.';

REVOKE ALL ON FUNCTION runrow.release_run(uuid, uuid, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.release_run(uuid, uuid, text, interval) TO runrow_worker;
