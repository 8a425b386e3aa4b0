-- Fleet scheduling (SPEC.md "Fleet scheduling"): what a run says about when, in which order
-- and under which limits it may be claimed, and who is told when it ends. Columns only; the
-- claim, the limits and the outbox that read them are separate migrations.
--
-- fairness_key and rate_limit_key are stored resolved (enqueue_run writes the user and the
-- model when the caller names none), so the claim and the limiter never fall back at read
-- time; the open runs of before this migration get the same values here. Runs that ended
-- before keep NULL: nothing reads those columns of an ended run.
-- depends: 0012_claim_blocked_turns

ALTER TABLE runrow.agent_run
ADD COLUMN not_before timestamptz,
ADD COLUMN priority integer NOT NULL DEFAULT 0
CONSTRAINT agent_run_priority_range CHECK (priority BETWEEN -1000 AND 1000),
ADD COLUMN fairness_key text
CONSTRAINT agent_run_fairness_key_length CHECK (length(fairness_key) BETWEEN 1 AND 200),
ADD COLUMN concurrency_key text
CONSTRAINT agent_run_concurrency_key_length CHECK (length(concurrency_key) BETWEEN 1 AND 200),
ADD COLUMN rate_limit_key text
CONSTRAINT agent_run_rate_limit_key_length CHECK (length(rate_limit_key) BETWEEN 1 AND 200),
ADD COLUMN token_budget bigint
CONSTRAINT agent_run_token_budget_positive CHECK (token_budget > 0),
ADD COLUMN cost_budget numeric
CONSTRAINT agent_run_cost_budget_positive CHECK (cost_budget > 0),
ADD COLUMN webhook_url text
CONSTRAINT agent_run_webhook_url_http CHECK (
    length(webhook_url) <= 2048 AND webhook_url ~ '^https?://[^[:space:]]+$'
);

UPDATE runrow.agent_run
SET fairness_key = user_id, rate_limit_key = model
WHERE status IN ('queued', 'running', 'waiting');

COMMENT ON COLUMN runrow.agent_run.not_before IS
'Not claimable before this instant (database clock): enqueue_run start_in, release_run '
'retry_in. NULL: claimable at once. Cleared when the run is requeued without a delay.';
COMMENT ON COLUMN runrow.agent_run.priority IS
'Claim priority, -1000..1000, higher first (enqueue_run priority; default 0).';
COMMENT ON COLUMN runrow.agent_run.fairness_key IS
'The tenant the claim is fair across: enqueue_run fairness_key, else the run''s user_id '
'(NULL: the anonymous tenant).';
COMMENT ON COLUMN runrow.agent_run.concurrency_key IS
'Key of a concurrency limit (set_concurrency_limit); NULL: no cap.';
COMMENT ON COLUMN runrow.agent_run.rate_limit_key IS
'Key of the fleet-wide model rate limit this run draws from (enqueue_run rate_limit_key, '
'else the model).';
COMMENT ON COLUMN runrow.agent_run.token_budget IS
'Most input + output tokens (cache reads counted as the API counts them) the run may use; NULL: no budget.';
COMMENT ON COLUMN runrow.agent_run.cost_budget IS
'Most USD the run may cost at the model_price table''s prices; NULL: no budget.';
COMMENT ON COLUMN runrow.agent_run.webhook_url IS
'Told (through the outbox) when the run ends; NULL: nobody.';

-- The signatures grow; the old ones go so a call by name is never ambiguous.
DROP FUNCTION IF EXISTS runrow.enqueue_run(uuid, jsonb, text, text, text, jsonb, integer, text, text, jsonb);
DROP FUNCTION IF EXISTS runrow.release_run(uuid, uuid, text);
DROP FUNCTION IF EXISTS runrow._end_claim(uuid, uuid, text, integer);
