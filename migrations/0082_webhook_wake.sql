-- depends: 0081_unicode_white_space
-- A new webhook delivery wakes the senders (channel runrow_webhooks). The sender waited for a
-- wake on runrow_enqueued, which the ending's trigger sent with each delivery until migration
-- 0037 made an ending notify only when another run can start; since then a delivery waited for
-- the sender's poll tick (--webhook-poll, 2 s) though the README said it went out within
-- moments (the webhooks review). A channel of its own, not runrow_enqueued: every idle
-- dispatcher of the fleet would make an empty claim for each run that ended with a webhook.
-- PostgreSQL 15 signals every listening backend of the database on a notifying commit whatever
-- the channel, so the channel adds no signal; the notification is sent only by a transaction
-- that wrote a delivery, the one case whose waiter's latency depends on it.
--
-- A statement trigger on the outbox, so every path that writes a delivery (the agent_run
-- ending trigger, whichever function ended the run) wakes, with one notification a statement
-- (identical notifications of a transaction are folded into one).

CREATE FUNCTION runrow._webhook_delivery_wake() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
    PERFORM pg_notify('runrow_webhooks', '');
    RETURN NULL;
END
$fn$;

COMMENT ON FUNCTION runrow._webhook_delivery_wake() IS
'webhook_delivery''s AFTER INSERT statement trigger: NOTIFY runrow_webhooks (empty payload), '
'so an idle webhook sender claims the new delivery at once instead of at its next poll tick.';

REVOKE ALL ON FUNCTION runrow._webhook_delivery_wake() FROM PUBLIC;

CREATE TRIGGER webhook_delivery_wake
AFTER INSERT ON runrow.webhook_delivery
FOR EACH STATEMENT EXECUTE FUNCTION runrow._webhook_delivery_wake();
