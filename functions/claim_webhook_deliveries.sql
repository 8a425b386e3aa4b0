CREATE OR REPLACE FUNCTION runrow.claim_webhook_deliveries(
    worker_id text DEFAULT NULL,
    max_deliveries integer DEFAULT 10,
    lease_seconds integer DEFAULT 30,
    max_attempts integer DEFAULT 8
)
RETURNS TABLE (
    delivery_id uuid,
    claim_token uuid,
    run_id uuid,
    url text,
    payload jsonb,
    attempt integer,
    claim_expires_at timestamptz,
    claimed_at timestamptz
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    IF length(claim_webhook_deliveries.worker_id) > 200 THEN
        RAISE EXCEPTION 'worker_id must be NULL or at most 200 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Each _require_* helper only raises, and a PERFORM is a statement: called only when the
    -- test before it fails, in the arguments' order, so the first bad one is still named.
    IF claim_webhook_deliveries.max_deliveries IS NULL OR claim_webhook_deliveries.max_deliveries NOT BETWEEN 1 AND 1000
       OR claim_webhook_deliveries.lease_seconds IS NULL OR claim_webhook_deliveries.lease_seconds NOT BETWEEN 1 AND 3600
       OR claim_webhook_deliveries.max_attempts IS NULL OR claim_webhook_deliveries.max_attempts NOT BETWEEN 1 AND 100 THEN
        PERFORM runrow._require_range(claim_webhook_deliveries.max_deliveries, 'max_deliveries', 1, 1000);
        PERFORM runrow._require_range(claim_webhook_deliveries.lease_seconds, 'lease_seconds', 1, 3600);
        PERFORM runrow._require_range(claim_webhook_deliveries.max_attempts, 'max_attempts', 1, 100);
    END IF;

    RETURN QUERY
    WITH due AS (
        SELECT w.id
        FROM runrow.webhook_delivery AS w
        WHERE w.state = 'pending' AND w.next_attempt_at <= now()
        ORDER BY w.next_attempt_at
        LIMIT claim_webhook_deliveries.max_deliveries
        FOR UPDATE OF w SKIP LOCKED
    ),

    taken AS (
        -- A row still holding a token here is one whose lease lapsed: its worker died or hung
        -- mid-delivery and recorded nothing. That attempt counts, so a receiver that kills
        -- every worker it meets still ends dead-lettered instead of looping forever.
        UPDATE runrow.webhook_delivery AS w
        SET state = CASE WHEN w.attempts >= claim_webhook_deliveries.max_attempts THEN 'dead' ELSE 'pending' END,
            attempts = CASE
                WHEN w.attempts < claim_webhook_deliveries.max_attempts THEN w.attempts + 1 ELSE w.attempts
            END,
            claim_token = CASE
                WHEN w.attempts < claim_webhook_deliveries.max_attempts THEN gen_random_uuid()
            END,
            claim_expires_at = CASE
                WHEN w.attempts < claim_webhook_deliveries.max_attempts
                    THEN now() + make_interval(secs => claim_webhook_deliveries.lease_seconds)
            END,
            -- While leased, due again when the lease ends: the same index finds a lapsed lease.
            next_attempt_at = CASE
                WHEN w.attempts < claim_webhook_deliveries.max_attempts
                    THEN now() + make_interval(secs => claim_webhook_deliveries.lease_seconds)
                ELSE w.next_attempt_at
            END,
            worker_id = CASE
                WHEN w.attempts < claim_webhook_deliveries.max_attempts THEN claim_webhook_deliveries.worker_id
                ELSE w.worker_id
            END,
            last_error = CASE
                WHEN w.claim_token IS NOT NULL
                    THEN format('lease expired: worker %s recorded no outcome of attempt %s',
                                coalesce(w.worker_id, '(unnamed)'), w.attempts)
                ELSE w.last_error
            END
        FROM due
        WHERE w.id = due.id
        RETURNING w.id, w.claim_token, w.run_id, w.url, w.payload, w.attempts, w.claim_expires_at, w.state
    )

    SELECT t.id, t.claim_token, t.run_id, t.url, t.payload, t.attempts, t.claim_expires_at, now()
    FROM taken AS t
    WHERE t.state = 'pending'
    ORDER BY t.claim_expires_at, t.id;
END
$fn$;

COMMENT ON FUNCTION runrow.claim_webhook_deliveries(text, integer, integer, integer) IS
'Lease up to max_deliveries (1..1000) due webhook deliveries (pending, next_attempt_at passed: '
'never tried, backoff over, or a lapsed lease) in due order, FOR UPDATE SKIP LOCKED, so any '
'number of workers may call it at once and no delivery goes to two of them while its lease '
'(lease_seconds, 1..3600) lives. Each comes back with a fresh claim_token, attempt = attempts '
'so far including this one, the body to POST, and claimed_at (the database clock, for the '
'signature''s timestamp). A delivery that already used max_attempts '
'(1..100; the last one''s worker died) is dead-lettered instead of returned. Record the '
'outcome with complete_webhook_delivery or fail_webhook_delivery; a lease that lapses without '
'one is taken over by the next claim, with the same delivery id.';

REVOKE ALL ON FUNCTION runrow.claim_webhook_deliveries(text, integer, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.claim_webhook_deliveries(text, integer, integer, integer) TO runrow_worker;
