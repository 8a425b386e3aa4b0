CREATE OR REPLACE FUNCTION runrow.fail_webhook_delivery(
    delivery_id uuid,
    claim_token uuid,
    error text,
    http_status integer DEFAULT NULL,
    max_attempts integer DEFAULT 8,
    backoff_seconds numeric DEFAULT 10,
    permanent boolean DEFAULT false
)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    outcome text;
BEGIN
    -- Each _require_* helper only raises, and a PERFORM is a statement: called only when the
    -- test before it fails, in the arguments' order, so the first bad one is still named.
    IF fail_webhook_delivery.delivery_id IS NULL OR fail_webhook_delivery.claim_token IS NULL
       OR fail_webhook_delivery.error IS NULL THEN
        PERFORM runrow._require_not_null(fail_webhook_delivery.delivery_id, 'delivery_id');
        PERFORM runrow._require_not_null(fail_webhook_delivery.claim_token, 'claim_token');
        PERFORM runrow._require_not_null(fail_webhook_delivery.error, 'error');
    END IF;
    IF fail_webhook_delivery.error = '' OR length(fail_webhook_delivery.error) > 10000 THEN
        RAISE EXCEPTION 'error must be 1 to 10000 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF fail_webhook_delivery.http_status NOT BETWEEN 100 AND 599 THEN
        RAISE EXCEPTION 'http_status must be NULL or between 100 and 599, got %', fail_webhook_delivery.http_status
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF fail_webhook_delivery.max_attempts IS NULL OR fail_webhook_delivery.max_attempts NOT BETWEEN 1 AND 100
       OR fail_webhook_delivery.backoff_seconds IS NULL OR fail_webhook_delivery.permanent IS NULL THEN
        PERFORM runrow._require_range(fail_webhook_delivery.max_attempts, 'max_attempts', 1, 100);
        PERFORM runrow._require_not_null(fail_webhook_delivery.backoff_seconds, 'backoff_seconds');
        PERFORM runrow._require_not_null(fail_webhook_delivery.permanent, 'permanent');
    END IF;
    IF NOT fail_webhook_delivery.backoff_seconds BETWEEN 0.1 AND 3600 THEN
        RAISE EXCEPTION 'backoff_seconds must be between 0.1 and 3600, got %', fail_webhook_delivery.backoff_seconds
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    UPDATE runrow.webhook_delivery AS w
    -- permanent: the failure will recur identically (no request can be built for the URL), so
    -- another attempt would only wait out a backoff to fail the same way.
    SET state = CASE
            WHEN fail_webhook_delivery.permanent OR w.attempts >= fail_webhook_delivery.max_attempts THEN 'dead'
            ELSE 'pending'
        END,
        -- Exponential on the database clock: backoff, 2x, 4x, ... after attempts 1, 2, 3, each
        -- stretched by a random 0-50%, capped at 6 hours so a long outage is retried a few
        -- times a day, not never. The jitter: deliveries that failed together (a receiver's
        -- outage) all came back at the same instant at every step, just as it recovered.
        next_attempt_at = now() + make_interval(secs => least(
            fail_webhook_delivery.backoff_seconds * power(2::numeric, w.attempts - 1)
                * (1 + random()::numeric / 2), 21600)),
        last_error = fail_webhook_delivery.error,
        last_http_status = fail_webhook_delivery.http_status,
        claim_token = NULL,
        claim_expires_at = NULL
    WHERE w.id = fail_webhook_delivery.delivery_id
      AND w.claim_token = fail_webhook_delivery.claim_token
      AND w.state = 'pending'
    RETURNING CASE WHEN w.state = 'dead' THEN 'dead' ELSE 'retrying' END INTO outcome;
    RETURN outcome;
END
$fn$;

COMMENT ON FUNCTION runrow.fail_webhook_delivery(uuid, uuid, text, integer, integer, numeric, boolean) IS
'This attempt failed: error (1..10000 characters) says how, http_status (100..599) what the '
'receiver answered, NULL when it answered nothing (refused, timed out, cut). Returns retrying '
'(due again at now() + backoff_seconds * 2^(attempts - 1), stretched by a random 0-50%, by '
'the database clock, at most 6 hours; '
'backoff_seconds 0.1..3600) or dead (dead-lettered: attempts reached max_attempts, 1..100, or '
'permanent is true: the failure will recur identically, so no attempt follows). '
'Fenced by claim_token and state pending: NULL, writing nothing, when the lease was taken over '
'or the delivery already ended.';

REVOKE ALL ON FUNCTION runrow.fail_webhook_delivery(uuid, uuid, text, integer, integer, numeric, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.fail_webhook_delivery(uuid, uuid, text, integer, integer, numeric, boolean) TO runrow_worker;
