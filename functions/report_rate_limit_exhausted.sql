CREATE OR REPLACE FUNCTION runrow.report_rate_limit_exhausted(run_id uuid, claim_token uuid, reset_in_seconds numeric)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    key text;
BEGIN
    PERFORM runrow._require_not_null(report_rate_limit_exhausted.run_id, 'run_id');
    PERFORM runrow._require_not_null(report_rate_limit_exhausted.claim_token, 'claim_token');
    PERFORM runrow._require_not_null(report_rate_limit_exhausted.reset_in_seconds, 'reset_in_seconds');
    -- The API's limits are per-minute buckets: an empty one is full again within a minute.
    -- A longer wait is a misread header, and would hold every worker of the key on it.
    PERFORM runrow._require_seconds(report_rate_limit_exhausted.reset_in_seconds, 'reset_in_seconds', 60);

    IF NOT runrow._hold_claim(report_rate_limit_exhausted.run_id, report_rate_limit_exhausted.claim_token) THEN
        RETURN;  -- fenced out: nothing written
    END IF;
    SELECT a.rate_limit_key INTO key FROM runrow.agent_run AS a WHERE a.id = report_rate_limit_exhausted.run_id;
    IF key IS NULL THEN
        RETURN;
    END IF;
    -- Unlike a 429 the response was answered, and is billed: the run's model-call reservation
    -- stays (the report is made while the answer streams, and a holder killed before it
    -- settles is charged the reservation at the reap). Nor is it a refusal: blocks_reported
    -- counts 429s only.
    PERFORM runrow._block_key(
        key,
        -- At least a millisecond: 1e-1000 is more than 0, and underflowed the cast (22003).
        now() + make_interval(secs => greatest(report_rate_limit_exhausted.reset_in_seconds, 0.001)::double precision),
        report_rate_limit_exhausted.run_id,
        0
    );
END
$fn$;

COMMENT ON FUNCTION runrow.report_rate_limit_exhausted(uuid, uuid, numeric) IS
'A model response for the run the worker holds said one of the API''s rate-limit buckets is '
'empty (anthropic-ratelimit-requests-remaining: 0): a request before it refills would be '
'refused 429, so the run''s rate_limit_key is blocked fleet-wide for reset_in_seconds (the '
'Python worker gives (reset - date) / limit, until one request is back, both the API''s clock; '
'a later block is never shortened), '
'as report_rate_limited blocks it for a 429: acquire_model_call grants nothing for the key '
'until the block ends, and the key''s requests bucket is emptied and refills only after it. '
'Creates the key''s row when it has no limits. Unlike report_rate_limited, the run''s '
'model-call reservation stays (the response is billed) and blocks_reported (429s) is not '
'counted. Fenced: nothing written unless claim_token holds the running run. Bad input (NULL, '
'reset_in_seconds not more than 0 or over 60) raises 22004/22023.';

REVOKE ALL ON FUNCTION runrow.report_rate_limit_exhausted(uuid, uuid, numeric) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.report_rate_limit_exhausted(uuid, uuid, numeric) TO runrow_worker;
