-- Fleet-wide rate limits and budgets (SPEC.md "Fleet scheduling", issue 13). The provider's
-- limits are per organisation, so each worker meeting a 429 alone is the retry storm; these
-- rows are the one state every worker in every language sees.
--
-- rate_limit: one row per rate_limit_key, three token buckets (requests, uncached input tokens,
-- output tokens) that refill with the database clock at their per-minute rate and hold at
-- most a minute's worth. The row is the lock: acquire_model_call, report_rate_limited and the
-- settlement in append_step take it FOR UPDATE, so concurrent callers never overdraw a bucket.
-- The requests bucket can never go below zero (a check); the token buckets can, by
-- settlement only (a step used more than its grant estimated): the debt delays the next grants.
--
-- Budgets: agent_run counts what the run has spent (settled by append_step), spend_hour what
-- each tenant spent per model per hour (the rolling day is the last 24 hours of it, so a
-- budget check reads at most 25 rows per model, whatever the history).
-- depends: 0018_fair_claim

CREATE TABLE runrow.rate_limit (
    rate_limit_key text PRIMARY KEY CONSTRAINT rate_limit_key_length CHECK (length(rate_limit_key) BETWEEN 1 AND 200),
    requests_per_minute integer CONSTRAINT rate_limit_rpm_positive CHECK (requests_per_minute > 0),
    input_tokens_per_minute integer CONSTRAINT rate_limit_itpm_positive CHECK (input_tokens_per_minute > 0),
    output_tokens_per_minute integer CONSTRAINT rate_limit_otpm_positive CHECK (output_tokens_per_minute > 0),
    requests_left numeric NOT NULL DEFAULT 0
    CONSTRAINT rate_limit_requests_never_overdrawn CHECK (requests_left >= 0),
    input_tokens_left numeric NOT NULL DEFAULT 0,
    output_tokens_left numeric NOT NULL DEFAULT 0,
    refilled_at timestamptz NOT NULL DEFAULT now(),
    blocked_until timestamptz,
    blocked_by_run uuid,
    blocks_reported bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT rate_limit_buckets_capped CHECK (
        (requests_per_minute IS NULL OR requests_left <= requests_per_minute)
        AND (input_tokens_per_minute IS NULL OR input_tokens_left <= input_tokens_per_minute)
        AND (output_tokens_per_minute IS NULL OR output_tokens_left <= output_tokens_per_minute)
    )
);

COMMENT ON TABLE runrow.rate_limit IS
'Fleet-wide model rate limits, one row per rate_limit_key (set_rate_limit; a row with no '
'limits holds only a block reported by report_rate_limited). *_left are token buckets '
'refilled with the database clock up to a minute''s worth; blocked_until stops every grant '
'for the key. Written only by set_rate_limit, acquire_model_call, report_rate_limited and '
'append_step, each under this row''s lock.';

CREATE TABLE runrow.model_price (
    model text PRIMARY KEY CONSTRAINT model_price_model_length CHECK (length(model) BETWEEN 1 AND 200),
    input_per_mtok numeric NOT NULL CONSTRAINT model_price_input_nonnegative CHECK (input_per_mtok >= 0),
    output_per_mtok numeric NOT NULL CONSTRAINT model_price_output_nonnegative CHECK (output_per_mtok >= 0),
    cache_write_per_mtok numeric NOT NULL
    CONSTRAINT model_price_cache_write_nonnegative CHECK (cache_write_per_mtok >= 0),
    cache_read_per_mtok numeric NOT NULL
    CONSTRAINT model_price_cache_read_nonnegative CHECK (cache_read_per_mtok >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE runrow.model_price IS
'USD per million tokens by model, filled by operators (set_model_price); cost budgets and '
'the spend views read it when append_step settles a step.';

CREATE TABLE runrow.tenant_budget (
    fairness_key text PRIMARY KEY CONSTRAINT tenant_budget_key_length CHECK (length(fairness_key) BETWEEN 1 AND 200),
    tokens_per_day bigint CONSTRAINT tenant_budget_tokens_positive CHECK (tokens_per_day > 0),
    cost_per_day numeric CONSTRAINT tenant_budget_cost_positive CHECK (cost_per_day > 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tenant_budget_something CHECK (tokens_per_day IS NOT NULL OR cost_per_day IS NOT NULL)
);

COMMENT ON TABLE runrow.tenant_budget IS
'A tenant''s (agent_run.fairness_key) budget over the last 24 hours (set_tenant_budget). '
'Its row is the lock that serializes the budget checks of the tenant''s parallel steps.';

CREATE TABLE runrow.spend_hour (
    -- '' is the anonymous tenant (runs without a fairness_key): a primary key has no NULL.
    fairness_key text NOT NULL,
    hour timestamptz NOT NULL,
    model text NOT NULL,
    model_calls bigint NOT NULL DEFAULT 0,
    input_tokens bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    cache_write_tokens bigint NOT NULL DEFAULT 0,
    cache_read_tokens bigint NOT NULL DEFAULT 0,
    tokens bigint NOT NULL DEFAULT 0,
    cost numeric NOT NULL DEFAULT 0,
    PRIMARY KEY (fairness_key, hour, model)
);

-- The rolling-day views read the last 25 hours of every tenant and model.
CREATE INDEX spend_hour_by_hour ON runrow.spend_hour (hour);

COMMENT ON TABLE runrow.spend_hour IS
'What each tenant spent on each model per hour (UTC hour start), settled by append_step from '
'each model turn''s usage. tokens = input + output + cache writes + cache reads, as the API '
'counts them; cost at model_price (0 without a price). fairness_key '''' is the anonymous tenant.';

ALTER TABLE runrow.agent_run
ADD COLUMN spent_tokens bigint NOT NULL DEFAULT 0,
ADD COLUMN spent_cost numeric NOT NULL DEFAULT 0,
ADD COLUMN granted_input_tokens integer,
ADD COLUMN budget_exhausted text;

COMMENT ON COLUMN runrow.agent_run.spent_tokens IS
'Tokens the run''s model turns used (input + output + cache writes + cache reads), settled by append_step.';
COMMENT ON COLUMN runrow.agent_run.spent_cost IS
'USD the run''s model turns cost at model_price, settled by append_step.';
COMMENT ON COLUMN runrow.agent_run.granted_input_tokens IS
'The input estimate of the run''s outstanding acquire_model_call grant; append_step settles '
'the bucket with the real usage and clears it.';
COMMENT ON COLUMN runrow.agent_run.budget_exhausted IS
'Why the run may make no further model request (budget_exhausted: ...), decided by append_step '
'in the transaction that recorded the crossing usage; acquire_model_call then ends the run.';

-- The DBA's view of spend: per run (the live set and the last day's finished runs through
-- agent_run_finished_idx), per tenant and per model over the last 24 hours.
CREATE VIEW runrow.spend_by_run AS
SELECT
    a.id AS run_id,
    a.status,
    a.fairness_key,
    a.model,
    a.spent_tokens,
    a.token_budget,
    a.spent_cost,
    a.cost_budget,
    a.budget_exhausted
FROM runrow.agent_run AS a
WHERE a.status IN ('queued', 'running', 'waiting')
UNION ALL
SELECT
    a.id,
    a.status,
    a.fairness_key,
    a.model,
    a.spent_tokens,
    a.token_budget,
    a.spent_cost,
    a.cost_budget,
    a.budget_exhausted
FROM runrow.agent_run AS a
WHERE a.finished_at > now() - interval '24 hours';

COMMENT ON VIEW runrow.spend_by_run IS
'Tokens and USD spent by each open run and each run finished in the last 24 hours, beside its budgets.';

CREATE VIEW runrow.spend_by_tenant AS
SELECT
    nullif(s.fairness_key, '') AS fairness_key,
    sum(s.model_calls) AS model_calls,
    sum(s.tokens) AS tokens,
    sum(s.cost) AS cost
FROM runrow.spend_hour AS s
WHERE s.hour > now() - interval '25 hours'
GROUP BY s.fairness_key;

COMMENT ON VIEW runrow.spend_by_tenant IS
'Each tenant''s model calls, tokens and USD over the rolling day (the hours that overlap the '
'last 24 hours; NULL: the anonymous tenant).';

-- Per budget, a range of spend_hour's primary key (fairness_key, hour): the cost grows with
-- the budgeted tenants, not with the other tenants or with history.
CREATE VIEW runrow.tenant_budgets AS
SELECT
    b.fairness_key,
    b.tokens_per_day,
    b.cost_per_day,
    t.tokens,
    t.cost,
    coalesce(t.tokens >= b.tokens_per_day OR t.cost >= b.cost_per_day, false) AS over_budget
FROM runrow.tenant_budget AS b
CROSS JOIN LATERAL (
    SELECT
        coalesce(sum(s.tokens), 0) AS tokens,
        coalesce(sum(s.cost), 0) AS cost
    FROM runrow.spend_hour AS s
    WHERE s.fairness_key = b.fairness_key AND s.hour > now() - interval '25 hours'
) AS t;

COMMENT ON VIEW runrow.tenant_budgets IS
'Every tenant budget (set_tenant_budget) beside the tenant''s rolling-day spend; over_budget: '
'its runs get no further model request and are not started.';

CREATE VIEW runrow.model_prices AS
SELECT
    p.model,
    p.input_per_mtok,
    p.output_per_mtok,
    p.cache_write_per_mtok,
    p.cache_read_per_mtok,
    p.updated_at
FROM runrow.model_price AS p;

COMMENT ON VIEW runrow.model_prices IS 'The price table (set_model_price), USD per million tokens.';

CREATE VIEW runrow.spend_by_model AS
SELECT
    s.model,
    sum(s.model_calls) AS model_calls,
    sum(s.input_tokens) AS input_tokens,
    sum(s.output_tokens) AS output_tokens,
    sum(s.cache_write_tokens) AS cache_write_tokens,
    sum(s.cache_read_tokens) AS cache_read_tokens,
    sum(s.cost) AS cost
FROM runrow.spend_hour AS s
WHERE s.hour > now() - interval '25 hours'
GROUP BY s.model;

COMMENT ON VIEW runrow.spend_by_model IS
'Model calls, tokens by kind and USD per model over the rolling day.';

CREATE VIEW runrow.rate_limit_blocks AS
SELECT
    l.rate_limit_key,
    l.blocked_until,
    l.blocked_until - now() AS time_left,
    l.blocked_by_run,
    l.blocks_reported
FROM runrow.rate_limit AS l
WHERE l.blocked_until > now();

COMMENT ON VIEW runrow.rate_limit_blocks IS
'Rate-limit keys blocked now (a 429 reported by report_rate_limited), with the time left.';

-- The lifecycle gains one edge: queued -> failed, only with budget_exhausted set (the claim
-- refusing to start a run of a tenant over its daily budget). The rest is 0009's guard.
CREATE OR REPLACE FUNCTION runrow._agent_run_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
BEGIN
    -- Invariant 2: terminal states are sticky. Nothing, not even the table owner,
    -- moves a row out of completed/failed/cancelled/dead or edits it. The one change
    -- allowed is trim_journal dropping the PII snapshot.
    IF OLD.status IN ('completed', 'failed', 'cancelled', 'dead') THEN
        IF NEW.request_snapshot IS NULL
           AND (to_jsonb(NEW) - 'request_snapshot' - 'updated_at')
               = (to_jsonb(OLD) - 'request_snapshot' - 'updated_at') THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'run % is % and terminal states are sticky', OLD.id, OLD.status
            USING ERRCODE = 'integrity_constraint_violation',
                  HINT = 'A terminal run can be run again only as a new run: runrow.retry_run().';
    END IF;
    -- Identity of a run never changes.
    IF NEW.id <> OLD.id
       OR NEW.conversation_id <> OLD.conversation_id
       OR NEW.user_message_id <> OLD.user_message_id
       OR NEW.prompt_id <> OLD.prompt_id
       OR NEW.model <> OLD.model
       OR NEW.created_at <> OLD.created_at
       OR NEW.enqueue_seq <> OLD.enqueue_seq THEN
        RAISE EXCEPTION 'run %: id, conversation, message, model, prompt and created_at are immutable', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    -- Status moves only along the lifecycle of SPEC.md.
    IF NEW.status <> OLD.status AND NOT (
        (OLD.status = 'queued' AND NEW.status IN ('running', 'cancelled'))
        -- A run of a tenant over its daily budget is not started: failed at claim, with why.
        OR (OLD.status = 'queued' AND NEW.status = 'failed' AND NEW.budget_exhausted IS NOT NULL)
        OR (OLD.status = 'running' AND NEW.status IN ('queued', 'waiting', 'completed', 'failed', 'cancelled', 'dead'))
        OR (OLD.status = 'waiting' AND NEW.status IN ('queued', 'cancelled'))
    ) THEN
        RAISE EXCEPTION 'run %: illegal status change % -> %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    -- Turn order: a turn starts only when no earlier turn of its conversation is still
    -- queued. The claim never picks such a turn; this makes it impossible. The earlier
    -- turns are read as "open" (agent_run_open_by_conversation) and tested for queued
    -- outside the query: a query on status = 'queued' can also be served by
    -- agent_run_claimable, which walks the whole queue ahead of the run (0009's header).
    IF NEW.status = 'running' AND OLD.status = 'queued' AND 'queued' = ANY (ARRAY(
        SELECT earlier.status FROM runrow.agent_run AS earlier
        WHERE earlier.conversation_id = NEW.conversation_id
          AND earlier.status IN ('queued', 'running', 'waiting')
          AND earlier.enqueue_seq < NEW.enqueue_seq
    )) THEN
        -- 40001: a concurrent enqueue committed an earlier turn after the claimer's
        -- snapshot; the claim treats it like any serialization failure and retries later.
        RAISE EXCEPTION 'run %: an earlier turn of conversation % is still queued', NEW.id, NEW.conversation_id
            USING ERRCODE = 'serialization_failure';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END
$fn$;

CREATE VIEW runrow.runs_in_backoff AS
SELECT
    a.id AS run_id,
    a.rate_limit_key,
    a.attempt,
    a.max_attempts,
    a.not_before,
    a.not_before - now() AS time_left,
    a.error AS last_error
FROM runrow.agent_run AS a
WHERE a.status = 'queued' AND a.not_before > now();

COMMENT ON VIEW runrow.runs_in_backoff IS
'Queued runs not claimable yet (enqueue start_in, release retry_in backoff), with the time left.';

CREATE VIEW runrow.tenants_over_budget AS
SELECT
    b.fairness_key,
    b.tokens,
    b.tokens_per_day,
    b.cost,
    b.cost_per_day
FROM runrow.tenant_budgets AS b
WHERE b.over_budget;

COMMENT ON VIEW runrow.tenants_over_budget IS
'Tenants whose rolling-day spend reached their budget: their runs get no further model request.';

-- The buckets as of now (the stored levels plus the refill since refilled_at), without writing.
CREATE VIEW runrow.rate_limits AS
WITH e AS (
    SELECT
        l.*,
        greatest(0, extract(EPOCH FROM now() - l.refilled_at)) AS secs
    FROM runrow.rate_limit AS l
)

SELECT
    e.rate_limit_key,
    e.requests_per_minute,
    e.input_tokens_per_minute,
    e.output_tokens_per_minute,
    least(e.requests_per_minute, e.requests_left + e.requests_per_minute * e.secs / 60) AS requests_left,
    least(e.input_tokens_per_minute, e.input_tokens_left + e.input_tokens_per_minute * e.secs / 60) AS input_tokens_left,
    least(e.output_tokens_per_minute, e.output_tokens_left + e.output_tokens_per_minute * e.secs / 60)
        AS output_tokens_left,
    CASE WHEN e.blocked_until > now() THEN e.blocked_until END AS blocked_until,
    CASE WHEN e.blocked_until > now() THEN e.blocked_until - now() END AS block_time_left,
    e.blocks_reported
FROM e;

COMMENT ON VIEW runrow.rate_limits IS
'Every rate-limit key: its per-minute limits, what each bucket holds now, and the block in force.';

GRANT SELECT ON runrow.rate_limit, runrow.model_price, runrow.tenant_budget, runrow.spend_hour TO runrow_auditor;
GRANT SELECT ON runrow.spend_by_run, runrow.spend_by_tenant, runrow.spend_by_model, runrow.rate_limit_blocks,
runrow.runs_in_backoff, runrow.tenants_over_budget, runrow.tenant_budgets, runrow.model_prices,
runrow.rate_limits TO runrow_auditor;
