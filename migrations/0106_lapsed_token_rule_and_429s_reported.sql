-- depends: 0103_429_cap_and_clock_set_back
-- Findings of the SQL review of migrations 0102-0103 (the other two, F4 and F6, were in
-- functions/_schedule_helpers.sql only; `runrow migrate` creates its new private helper
-- _stop_schedule_unparsed when it applies functions/ after this migration).
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

-- (2) defer_run's cap on deferrals for 429s (0103) counted only deferrals whose reason began
-- 429_cap: a worker that deferred after a run of 429s with any other reason (another worker, a
-- bug, a reworded reason) was never capped, though each such deferral followed 429s that blocked
-- the key for the whole fleet. The database hears each 429 (report_rate_limited), so it counts
-- them: reported_429s is how many the claim reported_429s_claim reported (a claim token: each
-- claim counts from 0, and a count left by an earlier claim is not the current one's), and
-- defer_run counts a deferral against the cap when the current claim reported more than the
-- agent's allowance for one attempt (5, pyworker/agent/limits.py MAX_429_IN_ATTEMPT), whatever
-- its reason; a reason beginning 429_cap still counts (functions/report_rate_limited.sql,
-- functions/defer_run.sql).
--
-- At the end of the row with 0103's column, behind every column a claim, a heartbeat and a finish
-- write (tests/test_agent_run_layout.py); a NOT NULL default is the catalogue's (no rewrite), and
-- the claim does not reset them (the token does). No CHECK, for 0103's reason: one is evaluated on
-- every update of the row, and report_rate_limited is the columns' only writer.
ALTER TABLE runrow.agent_run
ADD COLUMN reported_429s smallint NOT NULL DEFAULT 0,
ADD COLUMN reported_429s_claim uuid;

COMMENT ON COLUMN runrow.agent_run.reported_429s IS
'How many 429s report_rate_limited heard for this run from the claim reported_429s_claim (its '
'last claim that reported one), at most 32767. defer_run counts a deferral of that claim after '
'more than 5 against the cap on deferrals for 429s (cap_429_deferrals). Written only by '
'report_rate_limited.';
COMMENT ON COLUMN runrow.agent_run.reported_429s_claim IS
'The claim token of the claim whose 429s reported_429s counts (NULL before the first 429): a '
'new claim counts from 1. A token, so not readable by runrow_auditor. Written only by '
'report_rate_limited.';

-- 0073: a column is the auditor's only when granted (the count; the token is a capability).
GRANT SELECT (reported_429s) ON runrow.agent_run TO runrow_auditor;

COMMENT ON COLUMN runrow.agent_run.cap_429_deferrals IS
'How many times defer_run deferred this run for 429s (a reason beginning 429_cap, a worker''s '
'deferral after too many 429s in one attempt, or any reason after more than 5 429s reported in '
'the claim: reported_429s), at most 3: defer_run spends the attempt instead of a fourth '
'(release_run''s ending). Written only by defer_run.';
