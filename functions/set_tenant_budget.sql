CREATE OR REPLACE FUNCTION runrow.set_tenant_budget(fairness_key text, tokens_per_day bigint, cost_per_day numeric)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    PERFORM runrow._require_tenant_budget(set_tenant_budget.fairness_key, set_tenant_budget.tokens_per_day, set_tenant_budget.cost_per_day);

    IF set_tenant_budget.tokens_per_day IS NULL AND set_tenant_budget.cost_per_day IS NULL THEN
        DELETE FROM runrow.tenant_budget AS b WHERE b.fairness_key = set_tenant_budget.fairness_key;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'fairness_key "%" has no tenant budget to remove', set_tenant_budget.fairness_key
                USING ERRCODE = 'no_data_found';
        END IF;
        RETURN;
    END IF;
    -- Only a key being set: one stored before migration 0085 can still be removed (above).
    PERFORM runrow._require_printable(set_tenant_budget.fairness_key, 'fairness_key');
    INSERT INTO runrow.tenant_budget AS b (fairness_key, tokens_per_day, cost_per_day)
    VALUES (set_tenant_budget.fairness_key, set_tenant_budget.tokens_per_day, set_tenant_budget.cost_per_day)
    ON CONFLICT ON CONSTRAINT tenant_budget_pkey DO UPDATE
    SET tokens_per_day = excluded.tokens_per_day, cost_per_day = excluded.cost_per_day, updated_at = now();
END
$fn$;

COMMENT ON FUNCTION runrow.set_tenant_budget(text, bigint, numeric) IS
'The operator sets a tenant''s (agent_run.fairness_key, by default its user_id) budget over a '
'rolling day: tokens_per_day (input + output + cache writes + cache reads) and cost_per_day '
'(USD at model_price), each NULL (no limit) or more than 0. Once the tenant''s last 24 hours '
'reach it, acquire_model_call ends its runs budget_exhausted. Both NULL removes the budget; '
'P0002 when there is none. Bad input (NULL or over-long key, a budget not more than 0) raises '
'22004/22023 naming the argument and writes nothing.';

REVOKE ALL ON FUNCTION runrow.set_tenant_budget(text, bigint, numeric) FROM PUBLIC;
