-- depends: 0064_fairness_weight_floor
-- Prices and daily cost budgets are finite. PostgreSQL's numeric has NaN and ±Infinity, and NaN
-- sorts above every number, so the CHECKs of 0019 (>= 0, > 0) let 'NaN' and 'Infinity' through.
-- A price of NaN (or of Infinity: 0 tokens × Infinity is NaN) made the cost of every later call
-- of its model NaN; NaN summed into the tenant's rolling spend, and NaN >= cost_per_day is true,
-- so every run of the tenant was failed budget_exhausted for the next 25 hours, whatever the
-- model and even once the price was mended. A budget of NaN was never enforced. (Issue 11's SQL
-- audit.) x < 'Infinity' is false for NaN and +Infinity; the lower bounds exclude -Infinity.
--
-- A row that already holds such a value is removed: it never did what it said (a NaN budget
-- limited nothing; a NaN price priced nothing), and no finite value can stand in for it. Both
-- tables hold a row per model or tenant, so the CHECKs are validated as they are added.

DELETE FROM runrow.model_price
WHERE NOT (
    input_per_mtok < 'Infinity' AND output_per_mtok < 'Infinity'
    AND cache_write_per_mtok < 'Infinity' AND cache_read_per_mtok < 'Infinity'
);

DELETE FROM runrow.tenant_budget
WHERE cost_per_day >= 'Infinity' AND tokens_per_day IS NULL;

UPDATE runrow.tenant_budget SET cost_per_day = NULL, updated_at = now()
WHERE cost_per_day >= 'Infinity';

ALTER TABLE runrow.model_price
ADD CONSTRAINT model_price_finite CHECK (
    input_per_mtok < 'Infinity' AND output_per_mtok < 'Infinity'
    AND cache_write_per_mtok < 'Infinity' AND cache_read_per_mtok < 'Infinity'
);

ALTER TABLE runrow.tenant_budget
ADD CONSTRAINT tenant_budget_cost_finite CHECK (cost_per_day < 'Infinity');
