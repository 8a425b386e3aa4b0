CREATE OR REPLACE FUNCTION runrow.update_tenant_budget(
    fairness_key text, tokens_per_day bigint DEFAULT NULL, cost_per_day numeric DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    PERFORM runrow._require_tenant_budget(update_tenant_budget.fairness_key, update_tenant_budget.tokens_per_day, update_tenant_budget.cost_per_day);
    IF update_tenant_budget.tokens_per_day IS NULL AND update_tenant_budget.cost_per_day IS NULL THEN
        RAISE EXCEPTION 'tokens_per_day or cost_per_day must be given: NULL keeps that budget as it is '
            '(set_tenant_budget(fairness_key, NULL, NULL) removes the tenant''s budget)'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM runrow._require_printable(update_tenant_budget.fairness_key, 'fairness_key');
    -- One statement: the row lock of ON CONFLICT makes a concurrent update of the other budget
    -- wait and then keep this one (the CLI read the row, then set both: a change made between
    -- its read and its write was lost).
    INSERT INTO runrow.tenant_budget AS b (fairness_key, tokens_per_day, cost_per_day)
    VALUES (
        update_tenant_budget.fairness_key, update_tenant_budget.tokens_per_day, update_tenant_budget.cost_per_day
    )
    ON CONFLICT ON CONSTRAINT tenant_budget_pkey DO UPDATE
    SET
        tokens_per_day = coalesce(excluded.tokens_per_day, b.tokens_per_day),
        cost_per_day = coalesce(excluded.cost_per_day, b.cost_per_day),
        updated_at = now();
END
$fn$;

COMMENT ON FUNCTION runrow.update_tenant_budget(text, bigint, numeric) IS
'The operator changes part of a tenant''s budget over a rolling day (see set_tenant_budget): '
'each of tokens_per_day and cost_per_day given (more than 0) replaces that budget, and one '
'left NULL keeps the tenant''s current value (none for a new tenant: not limited), in one '
'statement under the row''s lock, so two concurrent updates of different budgets both stand. '
'To lift one budget, set_tenant_budget the whole; both NULL raises 22004. Bad input (NULL, '
'over-long or unprintable key, a budget not more than 0) raises 22004/22023 naming the '
'argument and writes nothing.';

REVOKE ALL ON FUNCTION runrow.update_tenant_budget(text, bigint, numeric) FROM PUBLIC;
