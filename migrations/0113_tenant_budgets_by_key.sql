-- depends: 0112_step_guard_last_seq_by_key
-- tenant_budgets sums each budgeted tenant's rolling day by spend_hour's key, as _tenant_spent
-- does since stop 62: the hour bound is a row comparison on the key, which spend_hour_by_hour
-- cannot serve.
--
-- Why: written `s.hour > now() - 25 h`, the planner read by_hour for each budget row (hour's
-- correlation is 1.0: spend_hour is written hour by hour) and filtered out every other tenant's
-- day, so reading the view cost budgets x every tenant's day. queue_metrics counts the tenants
-- over budget through this view, and the workers' metrics read queue_metrics on every scrape
-- (tests/test_tenant_spent_lookup.py: 5 budgets, 10 and 60 tenants x 10 models).
--
-- Unchanged: the columns, their meaning, the grants.

CREATE OR REPLACE VIEW runrow.tenant_budgets AS
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
    WHERE
        s.fairness_key = b.fairness_key
        AND (s.fairness_key, s.hour) > (b.fairness_key, now() - interval '25 hours')
) AS t;
