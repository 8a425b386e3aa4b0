-- depends: 0058_webhook_delivery_rules_in_one_check
-- Validate webhook_delivery_rules (added NOT VALID by 0058) in a transaction of its own: the
-- scan of webhook_delivery runs under SHARE UPDATE EXCLUSIVE, which deliveries do not wait
-- for. audit() reports the constraint while it is not validated.

ALTER TABLE runrow.webhook_delivery VALIDATE CONSTRAINT webhook_delivery_rules;
