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
--   retry_run and fork_run copy it). Ended runs are left as they ended (invariant 2).
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
