-- Lease the due deliveries among ids (one receiver's, in due order) for claim_webhook_deliveries:
-- at most max_n, and at most as many as the receiver has room for under max_per_receiver
-- unexpired leases, counted over the whole fleet. The caller holds the receiver's advisory
-- lock, so no other claim counts or leases for it until this transaction ends. A delivery that
-- used max_attempts (its last worker died) is dead-lettered and not returned.
CREATE OR REPLACE FUNCTION runrow._lease_webhook_deliveries(
    receiver text,
    ids uuid[],
    max_n integer,
    worker_id text,
    lease_seconds integer,
    max_attempts integer,
    max_per_receiver integer
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
AS $fn$
BEGIN
    RETURN QUERY
    WITH busy AS (
        -- Through webhook_delivery_leased: the leased rows only, whatever the table holds.
        SELECT count(*)::integer AS leases
        FROM runrow.webhook_delivery AS w
        WHERE runrow._webhook_receiver(w.url) = _lease_webhook_deliveries.receiver
          AND w.claim_token IS NOT NULL AND w.claim_expires_at > now()
    ),

    due AS (
        SELECT w.id
        FROM runrow.webhook_delivery AS w
        WHERE w.id = ANY (_lease_webhook_deliveries.ids) AND w.state = 'pending' AND w.next_attempt_at <= now()
        ORDER BY w.next_attempt_at
        LIMIT greatest(0, least(
            _lease_webhook_deliveries.max_per_receiver - (SELECT b.leases FROM busy AS b),
            _lease_webhook_deliveries.max_n
        ))
        FOR UPDATE OF w SKIP LOCKED
    ),

    taken AS (
        -- A row still holding a token here is one whose lease lapsed: its worker died or hung
        -- mid-delivery and recorded nothing. That attempt counts, so a receiver that kills
        -- every worker it meets still ends dead-lettered instead of looping forever.
        UPDATE runrow.webhook_delivery AS w
        SET state = CASE WHEN w.attempts >= _lease_webhook_deliveries.max_attempts THEN 'dead' ELSE 'pending' END,
            attempts = CASE
                WHEN w.attempts < _lease_webhook_deliveries.max_attempts THEN w.attempts + 1 ELSE w.attempts
            END,
            claim_token = CASE
                WHEN w.attempts < _lease_webhook_deliveries.max_attempts THEN gen_random_uuid()
            END,
            -- Dead-lettered with its lease lapsed: that lease's sender may have been answered
            -- 2xx and not recorded it yet, so complete_webhook_delivery still accepts its token.
            -- A new attempt's token is the only one: the lapsed one is forgotten.
            lapsed_claim_token = CASE
                WHEN w.attempts >= _lease_webhook_deliveries.max_attempts THEN w.claim_token
            END,
            claim_expires_at = CASE
                WHEN w.attempts < _lease_webhook_deliveries.max_attempts
                    THEN now() + make_interval(secs => _lease_webhook_deliveries.lease_seconds)
            END,
            -- While leased, due again when the lease ends: the same index finds a lapsed lease.
            next_attempt_at = CASE
                WHEN w.attempts < _lease_webhook_deliveries.max_attempts
                    THEN now() + make_interval(secs => _lease_webhook_deliveries.lease_seconds)
                ELSE w.next_attempt_at
            END,
            worker_id = CASE
                WHEN w.attempts < _lease_webhook_deliveries.max_attempts THEN _lease_webhook_deliveries.worker_id
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
    ORDER BY t.id;
END
$fn$;

REVOKE ALL ON FUNCTION runrow._lease_webhook_deliveries(text, uuid[], integer, text, integer, integer, integer)
FROM PUBLIC;
