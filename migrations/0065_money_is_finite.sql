-- depends: 0064_fairness_weight_floor
-- Prices and daily cost budgets are finite. PostgreSQL's numeric has NaN and ±Infinity, and NaN
-- sorts above every number, so the CHECKs of 0019 (>= 0, > 0) let 'NaN' and 'Infinity' through.
-- A price of NaN (or of Infinity: 0 tokens × Infinity is NaN) made the cost of every later call
-- of its model NaN; NaN summed into the tenant's rolling spend, and NaN >= cost_per_day is true,
-- so every run of the tenant was failed budget_exhausted for the next 25 hours, whatever the
-- model and even once the price was mended. A budget of NaN was never enforced. (Issue 11's SQL
-- audit.) x < 'Infinity' is false for NaN and +Infinity; the lower bounds exclude -Infinity.
--
-- What such values already wrote is repaired, not only refused from now on:
-- - a price or budget row that holds one is removed (it never did what it said: a NaN budget
--   limited nothing, a NaN price priced nothing; no finite value can stand in for it), each
--   named in a NOTICE so that the operator sets it again;
-- - the spend it poisoned counts 0: the tenant's hours (spend_hour.cost) and the open runs'
--   spent_cost, or the tenant stays failed for a day;
-- - an open run's non-finite cost_budget is dropped (enqueue_run refuses one from now on, and
--   retry_run and fork_run copy it), and agent_run's settings trigger refuses one from now on,
--   whoever writes the table (its rule agent_run_cost_budget_positive, 0034 and 0052, held NaN
--   > 0 true). Ended runs are left as they ended (invariant 2).
-- Both limit tables hold a row per model or tenant, so their CHECKs are validated as they are
-- added; the lock is waited for 5 s at most, since every claim and model call reads them.

SET LOCAL lock_timeout = '5s';

DO $$
DECLARE
    gone record;
BEGIN
    FOR gone IN
        DELETE FROM runrow.model_price
        WHERE NOT (
            input_per_mtok < 'Infinity' AND output_per_mtok < 'Infinity'
            AND cache_write_per_mtok < 'Infinity' AND cache_read_per_mtok < 'Infinity'
        )
        RETURNING model
    LOOP
        RAISE NOTICE 'model_price of "%" removed: a price was NaN or Infinity; set it again (set_model_price)',
            gone.model;
    END LOOP;
    FOR gone IN
        DELETE FROM runrow.tenant_budget
        WHERE cost_per_day >= 'Infinity' AND tokens_per_day IS NULL
        RETURNING fairness_key
    LOOP
        RAISE NOTICE 'tenant_budget of "%" removed: its cost_per_day was NaN or Infinity; set it again '
            '(set_tenant_budget)', gone.fairness_key;
    END LOOP;
    FOR gone IN
        UPDATE runrow.tenant_budget SET cost_per_day = NULL, updated_at = now()
        WHERE cost_per_day >= 'Infinity'
        RETURNING fairness_key
    LOOP
        RAISE NOTICE 'tenant_budget of "%": its cost_per_day was NaN or Infinity and is removed (its '
            'tokens_per_day stays); set it again (set_tenant_budget)', gone.fairness_key;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION runrow._agent_run_settings() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
DECLARE
    broken text;
BEGIN
    -- Each rule as the CHECK it replaces: NULL (an unknown) passes.
    broken := CASE
        WHEN (NEW.max_attempts >= 1 AND NEW.max_attempts <= 100) IS FALSE THEN 'agent_run_max_attempts_check'
        WHEN (NEW.model <> '') IS FALSE THEN 'agent_run_model_check'
        WHEN (NEW.idempotency_key <> '') IS FALSE THEN 'agent_run_idempotency_key_check'
        WHEN (jsonb_typeof(NEW.metadata) = 'object') IS FALSE THEN 'agent_run_metadata_check'
        WHEN (NEW.priority >= -1000 AND NEW.priority <= 1000) IS FALSE THEN 'agent_run_priority_range'
        WHEN (length(NEW.fairness_key) >= 1 AND length(NEW.fairness_key) <= 200) IS FALSE
            THEN 'agent_run_fairness_key_length'
        WHEN (length(NEW.concurrency_key) >= 1 AND length(NEW.concurrency_key) <= 200) IS FALSE
            THEN 'agent_run_concurrency_key_length'
        WHEN (length(NEW.rate_limit_key) >= 1 AND length(NEW.rate_limit_key) <= 200) IS FALSE
            THEN 'agent_run_rate_limit_key_length'
        WHEN (NEW.token_budget > 0) IS FALSE THEN 'agent_run_token_budget_positive'
        -- Finite too (0065): NaN sorts above every number, so NaN > 0 held.
        WHEN (NEW.cost_budget > 0 AND NEW.cost_budget < 'Infinity') IS FALSE THEN 'agent_run_cost_budget_positive'
        WHEN (length(NEW.webhook_url) <= 2048 AND NEW.webhook_url ~ '^https?://[^[:space:]]+$') IS FALSE
            THEN 'agent_run_webhook_url_http'
        WHEN ((NEW.forked_from IS NULL) = (NEW.forked_at_seq IS NULL)) IS FALSE THEN 'agent_run_fork_names_its_step'
        WHEN (NEW.forked_at_seq >= 0) IS FALSE THEN 'agent_run_forked_at_seq_check'
    END;
    IF broken IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "agent_run" violates check constraint "%"', broken
            USING ERRCODE = 'check_violation', CONSTRAINT = broken, SCHEMA = 'runrow', TABLE = 'agent_run';
    END IF;
    RETURN NULL;
END
$fn$;

COMMENT ON FUNCTION runrow._agent_run_settings() IS
'agent_run''s AFTER INSERT OR UPDATE OF <the columns an enqueue sets> row trigger: the 13 rules '
'that were CHECK constraints until migration 0034 (max_attempts 1..100, model and idempotency_key '
'not empty, metadata an object, priority -1000..1000, fairness/concurrency/rate-limit keys 1..200 '
'characters, budgets positive and the cost budget finite (0065), webhook_url an http(s) URL of at most 2048 characters, forked_from '
'and forked_at_seq set together, forked_at_seq >= 0), with CHECK''s meaning (NULL passes) and its '
'error: 23514 naming the rule as the constraint. Column-gated, so an UPDATE that assigns none of '
'those columns (every claim, heartbeat and finish) does not fire it. (A run''s references are '
'agent_run_owner_guard''s since 0052.)';

UPDATE runrow.spend_hour SET cost = 0
WHERE cost >= 'Infinity';

UPDATE runrow.agent_run SET spent_cost = 0, updated_at = now()
WHERE status IN ('queued', 'running', 'waiting') AND spent_cost >= 'Infinity';

UPDATE runrow.agent_run SET cost_budget = NULL, updated_at = now()
WHERE status IN ('queued', 'running', 'waiting') AND cost_budget >= 'Infinity';

ALTER TABLE runrow.model_price
ADD CONSTRAINT model_price_finite CHECK (
    input_per_mtok < 'Infinity' AND output_per_mtok < 'Infinity'
    AND cache_write_per_mtok < 'Infinity' AND cache_read_per_mtok < 'Infinity'
);

ALTER TABLE runrow.tenant_budget
ADD CONSTRAINT tenant_budget_cost_finite CHECK (cost_per_day < 'Infinity');
