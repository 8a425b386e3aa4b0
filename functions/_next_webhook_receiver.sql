-- The first receiver (_webhook_receiver) after `after` in text order that has a pending delivery,
-- or NULL: one descent of webhook_delivery_pending_by_receiver. claim_webhook_deliveries walks
-- the receivers with it ('' gives the first). PL/pgSQL, whose body is resolved when it runs: a
-- SQL body is checked when created, and functions/ are applied to a database at any migration
-- (the upgrade test applies them at 0060, before 0078 defines _webhook_receiver).
CREATE OR REPLACE FUNCTION runrow._next_webhook_receiver(after text)
RETURNS text
LANGUAGE plpgsql
STABLE
AS $fn$
BEGIN
    RETURN (
        SELECT runrow._webhook_receiver(v.url)
        FROM runrow.webhook_delivery AS v
        WHERE v.state = 'pending' AND runrow._webhook_receiver(v.url) > _next_webhook_receiver.after
        ORDER BY runrow._webhook_receiver(v.url)
        LIMIT 1
    );
END
$fn$;

COMMENT ON FUNCTION runrow._next_webhook_receiver(text) IS
'Private. The first receiver after `after` (text order) with a pending webhook delivery, or NULL; '
'one descent of the index webhook_delivery_pending_by_receiver. claim_webhook_deliveries walks '
'the receivers with it.';

REVOKE ALL ON FUNCTION runrow._next_webhook_receiver(text) FROM PUBLIC;
