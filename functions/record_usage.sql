CREATE OR REPLACE FUNCTION runrow.record_usage(run_id uuid, claim_token uuid, usage jsonb)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    PERFORM runrow._require_not_null(record_usage.run_id, 'run_id');
    PERFORM runrow._require_not_null(record_usage.claim_token, 'claim_token');
    PERFORM runrow._require_not_null(record_usage.usage, 'usage');
    IF jsonb_typeof(record_usage.usage) <> 'object' THEN
        RAISE EXCEPTION 'usage must be a JSON object (the response''s usage), got %', jsonb_typeof(record_usage.usage)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF NOT runrow._hold_claim(record_usage.run_id, record_usage.claim_token) THEN
        RETURN false;  -- fenced out: nothing written
    END IF;
    -- What append_step settles for a stored turn: a response the API billed is paid for
    -- whether or not it became a step (the money audit: a stream cut, stopped or empty was
    -- billed and never counted, so a tenant's budget could be overrun by every attempt).
    PERFORM runrow._settle_usage(record_usage.run_id, record_usage.usage);
    RETURN true;
END
$fn$;

COMMENT ON FUNCTION runrow.record_usage(uuid, uuid, jsonb) IS
'Settle the usage of a model response that is not stored as a step: a stream cut or failed '
'after its message_start, one stopped mid-stream, a turn with empty content. usage is the '
'response''s usage object as far as it was received (input_tokens, output_tokens, '
'cache_creation_input_tokens, cache_read_input_tokens; a missing or non-numeric field counts '
'0). It is settled exactly as append_step settles a stored turn''s usage: the run''s '
'spent_tokens and spent_cost, the tenant''s spend_hour, the rate-limit key''s token buckets, '
'and the run''s and tenant''s budgets (a crossed one makes the next acquire_model_call end '
'the run). run_usage, which sums the step log, does not include it. Returns true; fenced out '
'(claim_token does not hold the running run) false and nothing written. Bad input (NULL, '
'usage not a JSON object) raises 22004/22023.';

REVOKE ALL ON FUNCTION runrow.record_usage(uuid, uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.record_usage(uuid, uuid, jsonb) TO runrow_worker;
