-- depends: 0098_update_rate_limit_keeps_pace
-- Two defects of migration 0095's "a 403 refused again after the key answered another request
-- is the run's own" (report_key_error, the review of session 60), and one of 0097's waiter.
--
-- (A) The key's answers only grow when its probe after a block is answered. A run whose own
-- request draws the 403, and which is itself the probe every time (the key's only active run,
-- or one the claim order favours), never saw an answer: each refusal doubled the block up to
-- max_block_seconds, the run never failed, got its attempt back, and every other run of the key
-- waited for good. Now the probe of the key's only open run, refused with the same 403 as the
-- run's last refusal when the key's block has already reached max_block_seconds (the key refused
-- through its whole backoff: 615 s with the defaults 5 and 300, so a key outage of a few minutes
-- fails nothing), is taken for the run's own request: the run fails once. With other runs of the
-- key waiting it is not (a long key-wide 403 would fail one per longest block): a run the claim
-- order makes the probe every time still holds them (not covered).
--
-- (B) A key that broke again with a key-wide 403 failed every run still holding a key error of
-- the first outage and not answered since (workers with different API keys may share a
-- rate_limit_key). The run's last refusal is kept now (agent_run.key_error_refused: the 403's
-- text, NULL for any other key error), and a refusal counts as the run's own only when it is
-- that same 403 again.
--
-- (C) functions/_tenant_reservation.sql: a queued waiter is due at most a minute after its last
-- ask, so one deferred for hours (a 429's retry-after) no longer holds its tenant's room for
-- them (the column comment below).
--
-- agent_run's column goes at the end of the row, behind the model-call columns (0080, 0084,
-- 0095): a claim, a heartbeat and a finish never write it.

ALTER TABLE runrow.agent_run
ADD COLUMN key_error_refused text;

COMMENT ON COLUMN runrow.agent_run.key_error_refused IS
'The 403 (report_key_error with own_request_possible; its first 1000 characters) this run''s '
'request last got as an API key or account error, or NULL when its last key error was another '
'(a 401, a 402, a credit balance). A refusal counts as the run''s own request''s only when it '
'is this same 403 again.';

-- 0073: a column is the auditor's only when granted.
GRANT SELECT (key_error_refused) ON runrow.agent_run TO runrow_auditor;

-- _key_error_told gains the refusal to keep (functions/_limits_helpers.sql defines it).
DROP FUNCTION IF EXISTS runrow._key_error_told(uuid, timestamptz);

COMMENT ON COLUMN runrow.tenant_budget.waiter_run IS
'The run whose model call has waited longest for room in the budget (budget_reserved), or NULL: '
'while it waits another call of the tenant goes only if it fits beside the waiter''s '
'reservation (waiter_tokens, waiter_cost) too. Cleared when it is granted; ignored once its run '
'is no longer queued or running, or is running and has not asked for a minute (waiter_seen_at), '
'or is queued and has been due (not_before, else waiter_seen_at, but at most a minute after '
'waiter_seen_at) for five minutes.';
