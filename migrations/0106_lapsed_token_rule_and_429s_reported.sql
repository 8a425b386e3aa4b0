-- depends: 0103_429_cap_and_clock_set_back
-- Findings of the SQL review of migrations 0102-0103.
--
-- (1) webhook_delivery.lapsed_claim_token (0102) is kept only while no lease is held and the
-- delivery is dead or re-armed (pending): complete_webhook_delivery accepts it only then, and a
-- new attempt's claim clears it. Its writers (_lease_webhook_deliveries, which sets it with the
-- state dead and no claim token, and complete_webhook_delivery, which clears it) held that, the
-- schema did not: an UPDATE that leased the row or marked it delivered kept a token that a late
-- sender could still use. A CHECK of its own, not a tenth rule of webhook_delivery_rules (0058):
-- that would replace the constraint, and audit() reports it missing until it is validated again.
-- This one is short, so it adds little to the per-statement cost 0058 cut.
--
-- NOT VALID, and left so here: a migration is one transaction, and a VALIDATE in it scans the
-- table under the ADD's ACCESS EXCLUSIVE lock, which stops every run with a webhook from ending
-- (agent_run's trigger inserts its delivery) for the length of the scan. A NOT VALID CHECK still
-- binds every row inserted or updated from now on; the rows already there were written by the
-- two writers above, which keep the rule. Validate it when convenient, in a transaction of its
-- own (SHARE UPDATE EXCLUSIVE, beside deliveries), as 0059 did:
--     ALTER TABLE runrow.webhook_delivery VALIDATE CONSTRAINT webhook_delivery_lapsed_token;
ALTER TABLE runrow.webhook_delivery
ADD CONSTRAINT webhook_delivery_lapsed_token CHECK (
    lapsed_claim_token IS NULL OR (claim_token IS NULL AND state IN ('pending', 'dead'))
) NOT VALID;

COMMENT ON CONSTRAINT webhook_delivery_lapsed_token ON runrow.webhook_delivery IS
'lapsed_claim_token (the token of a lease that lapsed into a dead letter, which '
'complete_webhook_delivery still accepts) is set only while no lease is held (claim_token NULL) '
'and the delivery is dead or re-armed (pending). Migration 0106.';
