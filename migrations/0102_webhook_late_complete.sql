-- depends: 0101_key_error_probe
-- A delivery whose POST succeeded could end dead-lettered: when its last attempt's lease ran
-- out before the sender recorded the 2xx (a slow database, a sender paused past the 20 s
-- lease), the next claim dead-lettered it and cleared its claim token, so the sender's late
-- complete_webhook_delivery was fenced out and the delivery stayed dead; an operator who
-- re-armed it sent the receiver a duplicate (the webhooks review).
--
-- lapsed_claim_token keeps the token of the lease that lapsed into that dead letter. The sender
-- that held exactly that lease may still say it delivered (functions/
-- complete_webhook_delivery.sql), until a new attempt is claimed with a new token, which clears
-- it (functions/_lease_webhook_deliveries.sql). A lapsed lease that is taken over instead
-- (attempts left) never sets it: the new attempt's token is the only one.
--
-- A token is a capability, not something to look at: like claim_token (0073), the column is
-- not granted to runrow_auditor (a column this migration adds is not the auditor's unless
-- granted).

ALTER TABLE runrow.webhook_delivery ADD COLUMN lapsed_claim_token uuid;

COMMENT ON COLUMN runrow.webhook_delivery.lapsed_claim_token IS
'The claim token of the lease that lapsed when a claim dead-lettered the delivery (its attempts '
'used up, no outcome recorded): complete_webhook_delivery still accepts it, since the sender '
'that held that lease may have been answered 2xx. NULL otherwise; cleared when a new attempt '
'is claimed. Set only while claim_token is NULL. Not readable by runrow_auditor.';
