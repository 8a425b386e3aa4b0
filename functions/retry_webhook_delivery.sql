CREATE OR REPLACE FUNCTION runrow.retry_webhook_delivery(delivery_id uuid)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    PERFORM runrow._require_not_null(retry_webhook_delivery.delivery_id, 'delivery_id');
    UPDATE runrow.webhook_delivery AS w
    SET state = 'pending', attempts = 0, next_attempt_at = now()
    WHERE w.id = retry_webhook_delivery.delivery_id AND w.state = 'dead';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- Due now: an idle sender claims it at once, not at its next poll tick.
    PERFORM pg_notify('runrow_webhooks', '');
    RETURN true;
END
$fn$;

COMMENT ON FUNCTION runrow.retry_webhook_delivery(uuid) IS
'A person''s decision to try a dead-lettered webhook delivery again (the receiver is fixed): '
'pending again at once, attempts back to 0, same delivery id and body, and the senders woken '
'(NOTIFY runrow_webhooks). false, writing nothing, '
'when the delivery is not dead (pending or delivered) or does not exist.';

REVOKE ALL ON FUNCTION runrow.retry_webhook_delivery(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.retry_webhook_delivery(uuid) TO runrow_client;
