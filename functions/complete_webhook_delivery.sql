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
    -- saying so spares it a duplicate. That holds too for a lease that lapsed into a dead letter
    -- (its attempts used up; lapsed_claim_token), until a new attempt is claimed: a re-armed
    -- delivery would otherwise be sent again. A takeover changed the token, so a zombie writes
    -- nothing.
    UPDATE runrow.webhook_delivery AS w
    SET state = 'delivered',
        delivered_at = now(),
        last_http_status = complete_webhook_delivery.http_status,
        claim_token = NULL,
        claim_expires_at = NULL,
        lapsed_claim_token = NULL
    WHERE w.id = complete_webhook_delivery.delivery_id
      AND (
          (w.state = 'pending' AND w.claim_token = complete_webhook_delivery.claim_token)
          OR (w.state IN ('pending', 'dead') AND w.claim_token IS NULL
              AND w.lapsed_claim_token = complete_webhook_delivery.claim_token)
      );
    RETURN FOUND;
END
$fn$;

COMMENT ON FUNCTION runrow.complete_webhook_delivery(uuid, uuid, integer) IS
'The receiver answered http_status (200..299): the delivery is delivered, which is final. '
'Fenced by claim_token: true for the token of the delivery''s current lease (pending; lapsed '
'or not), and for the token of the lease that lapsed when a claim dead-lettered it '
'(lapsed_claim_token), dead or re-armed, until a new attempt is claimed; false, writing '
'nothing, for any other token (the lease was taken over by another worker, which delivers '
'again with the same delivery id), or when the delivery is delivered or failed by its '
'holder.';

REVOKE ALL ON FUNCTION runrow.complete_webhook_delivery(uuid, uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.complete_webhook_delivery(uuid, uuid, integer) TO runrow_worker;
