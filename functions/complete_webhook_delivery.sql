CREATE OR REPLACE FUNCTION runrow.complete_webhook_delivery(
    delivery_id uuid, claim_token uuid, http_status integer
)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    -- Each _require_* helper only raises, and a PERFORM is a statement: called only when the
    -- test before it fails, in the arguments' order, so the first bad one is still named.
    IF complete_webhook_delivery.delivery_id IS NULL OR complete_webhook_delivery.claim_token IS NULL
       OR complete_webhook_delivery.http_status IS NULL OR complete_webhook_delivery.http_status NOT BETWEEN 200 AND 299 THEN
        PERFORM runrow._require_not_null(complete_webhook_delivery.delivery_id, 'delivery_id');
        PERFORM runrow._require_not_null(complete_webhook_delivery.claim_token, 'claim_token');
        PERFORM runrow._require_range(complete_webhook_delivery.http_status, 'http_status', 200, 299);
    END IF;

    -- A lease that lapsed but was not taken over still matches: the receiver got it, and
    -- saying so spares it a duplicate. A takeover changed the token, so a zombie writes nothing.
    UPDATE runrow.webhook_delivery AS w
    SET state = 'delivered',
        delivered_at = now(),
        last_http_status = complete_webhook_delivery.http_status,
        claim_token = NULL,
        claim_expires_at = NULL
    WHERE w.id = complete_webhook_delivery.delivery_id
      AND w.claim_token = complete_webhook_delivery.claim_token
      AND w.state = 'pending';
    RETURN FOUND;
END
$fn$;

COMMENT ON FUNCTION runrow.complete_webhook_delivery(uuid, uuid, integer) IS
'The receiver answered http_status (200..299): the delivery is delivered, which is final. '
'Fenced by claim_token and state pending: false, writing nothing, when the lease was taken over '
'by another worker (which delivers again, with the same delivery id) or the delivery already '
'ended.';

REVOKE ALL ON FUNCTION runrow.complete_webhook_delivery(uuid, uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.complete_webhook_delivery(uuid, uuid, integer) TO runrow_worker;
