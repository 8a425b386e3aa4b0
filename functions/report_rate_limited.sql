CREATE OR REPLACE FUNCTION runrow.report_rate_limited(run_id uuid, claim_token uuid, retry_after_seconds numeric)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    key text;
    until timestamptz;
BEGIN
    PERFORM runrow._require_not_null(report_rate_limited.run_id, 'run_id');
    PERFORM runrow._require_not_null(report_rate_limited.claim_token, 'claim_token');
    PERFORM runrow._require_not_null(report_rate_limited.retry_after_seconds, 'retry_after_seconds');
    PERFORM runrow._require_seconds(report_rate_limited.retry_after_seconds, 'retry_after_seconds', 86400);

    IF NOT runrow._hold_claim(report_rate_limited.run_id, report_rate_limited.claim_token) THEN
        RETURN;  -- fenced out: nothing written
    END IF;
    -- The call was refused, and a refusal is not billed: its reservation goes, or a holder
    -- killed while it waits out the block would be charged for it at the reap (the review of 0080).
    -- The claim's 429s are counted: defer_run caps the deferrals after more than the agent's
    -- allowance for one attempt by this count, not by what the worker says (migration 0106),
    -- and the run's since its last answer: defer_run releases it at 24 (migration 0109).
    UPDATE runrow.agent_run AS a
    SET model_call_reserved = NULL,
        model_call_attempt = NULL,
        reported_429s = CASE
            WHEN a.reported_429s_claim = report_rate_limited.claim_token THEN least(a.reported_429s + 1, 32767)
            ELSE 1
        END,
        reported_429s_claim = report_rate_limited.claim_token,
        unanswered_429s = least(a.unanswered_429s + 1, 32767),
        updated_at = now()
    WHERE a.id = report_rate_limited.run_id
    RETURNING a.rate_limit_key INTO key;
    IF key IS NULL THEN
        PERFORM runrow._tenant_unreserve(report_rate_limited.run_id);
        RETURN;
    END IF;
    -- At least a millisecond: 1e-1000 is more than 0, and underflowed the cast (22003).
    until := now() + make_interval(secs => greatest(report_rate_limited.retry_after_seconds, 0.001)::double precision);

    -- The provider's bucket is empty: ours is emptied too, and refills only once the block
    -- ends (refilled_at in the future), so the fleet does not burst into the wall again.
    PERFORM runrow._block_key(key, until, report_rate_limited.run_id, 1);
    -- Out of its tenant's total too (migration 0088): after the key's row, as a grant locks them.
    PERFORM runrow._tenant_unreserve(report_rate_limited.run_id);
END
$fn$;

COMMENT ON FUNCTION runrow.report_rate_limited(uuid, uuid, numeric) IS
'A worker got a 429 for the run it holds: the run''s rate_limit_key is blocked fleet-wide for '
'retry_after_seconds (the API''s retry-after; a later block is never shortened). From this '
'commit on acquire_model_call grants nothing for the key until the block ends, and the '
'key''s requests bucket is emptied and refills only after it. Creates the key''s row when it '
'has no limits. '
'The run''s model-call reservation (acquire_model_call) is dropped, from its tenant''s '
'reserved total too: a 429 is not billed. The 429 is counted for the claim '
'(agent_run.reported_429s, from 1 for each claim): defer_run counts a deferral after more than 5 '
'against its cap on deferrals for 429s. It is counted for the run too, since its last answered '
'model call (agent_run.unanswered_429s, whatever the claim; 0 again when a usage settles): '
'defer_run releases the run, its attempt spent, instead of deferring it once that reaches 24. '
'Fenced: nothing written unless claim_token holds the running run. Bad input '
'(NULL, retry_after_seconds not more than 0 or over 86400) raises 22004/22023.';

REVOKE ALL ON FUNCTION runrow.report_rate_limited(uuid, uuid, numeric) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.report_rate_limited(uuid, uuid, numeric) TO runrow_worker;
