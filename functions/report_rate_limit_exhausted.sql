CREATE OR REPLACE FUNCTION runrow.report_rate_limit_exhausted(
    run_id uuid, claim_token uuid, reset_in_seconds numeric, requests_limit integer DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    key text;
    until timestamptz;
BEGIN
    PERFORM runrow._require_not_null(report_rate_limit_exhausted.run_id, 'run_id');
    PERFORM runrow._require_not_null(report_rate_limit_exhausted.claim_token, 'claim_token');
    PERFORM runrow._require_not_null(report_rate_limit_exhausted.reset_in_seconds, 'reset_in_seconds');
    -- The API's limits are per-minute buckets: an empty one is full again within a minute.
    -- A longer wait is a misread header, and would hold every worker of the key on it.
    PERFORM runrow._require_seconds(report_rate_limit_exhausted.reset_in_seconds, 'reset_in_seconds', 60);
    PERFORM runrow._require_positive(report_rate_limit_exhausted.requests_limit, 'requests_limit');

    IF NOT runrow._hold_claim(report_rate_limit_exhausted.run_id, report_rate_limit_exhausted.claim_token) THEN
        RETURN;  -- fenced out: nothing written
    END IF;
    SELECT a.rate_limit_key INTO key FROM runrow.agent_run AS a WHERE a.id = report_rate_limit_exhausted.run_id;
    IF key IS NULL THEN
        RETURN;
    END IF;
    -- At least a millisecond: 1e-1000 is more than 0, and underflowed the cast (22003).
    until := now() + make_interval(secs => greatest(report_rate_limit_exhausted.reset_in_seconds, 0.001)::double precision);
    -- Unlike a 429 the response was answered, and is billed: the run's model-call reservation
    -- stays (the report is made while the answer streams, and a holder killed before it
    -- settles is charged the reservation at the reap). Nor is it a refusal: blocks_reported
    -- counts 429s only.
    PERFORM runrow._block_key(key, until, report_rate_limit_exhausted.run_id, 0);
    IF report_rate_limit_exhausted.requests_limit IS NULL THEN
        RETURN;
    END IF;
    -- With the limit known, reset_in_seconds is the API's pace: its bucket of requests_limit
    -- refills one request per reset_in_seconds (the block lasts until one is back). A key with
    -- no requests limit of its own had nothing to hold its waiting requests to once the block
    -- ended: all went at once, and all but one met the empty bucket as 429s (bench/rate_limits).
    -- So its requests bucket mirrors the API's: the block ends with the one request back, then
    -- it refills one per reset_in_seconds up to requests_limit, and once it has stood full for
    -- one more request's time (nobody drew on it for as long as the API's takes to fill) the
    -- pace is over (_lock_bucket). Each report sets it anew.
    UPDATE runrow.rate_limit AS l
    SET paced_requests_per_minute = round(60 / greatest(report_rate_limit_exhausted.reset_in_seconds, 0.001), 6),
        paced_requests_limit = report_rate_limit_exhausted.requests_limit,
        requests_left = 1
    WHERE l.rate_limit_key = key AND l.requests_per_minute IS NULL;
END
$fn$;

COMMENT ON FUNCTION runrow.report_rate_limit_exhausted(uuid, uuid, numeric, integer) IS
'A model response for the run the worker holds said one of the API''s rate-limit buckets is '
'empty (anthropic-ratelimit-requests-remaining: 0): a request before it refills would be '
'refused 429, so the run''s rate_limit_key is blocked fleet-wide for reset_in_seconds (the '
'Python worker gives (reset - date) / limit, until one request is back, both the API''s clock; '
'a later block is never shortened), '
'as report_rate_limited blocks it for a 429: acquire_model_call grants nothing for the key '
'until the block ends, and the key''s requests bucket is emptied and refills only after it. '
'The block is a rate block: a key error''s hold lifted meanwhile (its probe answered) leaves it '
'in force. With requests_limit (the header''s anthropic-ratelimit-requests-limit; DEFAULT NULL: '
'no pace), a key with no requests_per_minute of its own (set_rate_limit) is paced after the '
'block: its requests bucket mirrors the API''s, ending the block with one request back, then '
'refilling one request per reset_in_seconds (60 / reset_in_seconds a minute) up to '
'requests_limit, and the pace ends when it has stood full for one more reset_in_seconds (the '
'API''s is full then, and the key''s demand under its pace); so the slots '
'waiting on the block are granted one at a time, not at once into the API''s empty bucket. '
'Each report sets the pace anew. '
'Creates the key''s row when it has no limits. Unlike report_rate_limited, the run''s '
'model-call reservation stays (the response is billed) and blocks_reported (429s) is not '
'counted. Fenced: nothing written unless claim_token holds the running run. Bad input (NULL, '
'reset_in_seconds not more than 0 or over 60, requests_limit not more than 0) raises 22004/22023.';

REVOKE ALL ON FUNCTION runrow.report_rate_limit_exhausted(uuid, uuid, numeric, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.report_rate_limit_exhausted(uuid, uuid, numeric, integer) TO runrow_worker;
