-- depends: 0110_key_error_run_age
-- Validate webhook_delivery_lapsed_token (added NOT VALID by 0106) in a transaction of its own,
-- as 0059 validated webhook_delivery_rules: the scan of webhook_delivery runs under SHARE UPDATE
-- EXCLUSIVE, which deliveries do not wait for. audit() reports the constraint while it is not
-- validated (functions/audit.sql).

ALTER TABLE runrow.webhook_delivery VALIDATE CONSTRAINT webhook_delivery_lapsed_token;
