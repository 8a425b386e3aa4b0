-- depends: 0082_webhook_wake
-- The pending deliveries by receiver, for claim_webhook_deliveries' walk over receivers. A claim
-- reads the due deliveries in due order, and past a backlog held back at full receivers it reads
-- on at most 10,000 of them: deliveries behind more than that (10,000 due to one receiver that
-- never answers, which any user who may set webhook_url can arrange) waited for hours to days
-- (the review of stop 57). When a claim's sweeps stop at that bound, it walks the receivers that
-- have a pending delivery instead, one descent of this index each, and leases the due ones of
-- those with room: its cost is the receivers it visits, not the backlog.
--
-- Partial (pending rows only) and on the receiver, so building it computes _webhook_receiver
-- for the pending rows alone, under a SHARE lock (writes to webhook_delivery wait, reads do not).
-- To avoid even that on a large outbox, build it with CREATE INDEX CONCURRENTLY and this
-- definition before migrating: IF NOT EXISTS then leaves it.
CREATE INDEX IF NOT EXISTS webhook_delivery_pending_by_receiver
ON runrow.webhook_delivery (runrow._webhook_receiver(url), next_attempt_at)
WHERE state = 'pending';
