-- depends: 0087_rate_block_apart
-- A tenant's runs in flight together each crossed its budget once: acquire_model_call checked
-- only the spend already settled, so a tenant with 100 runs in flight and $0.10 left of its
-- cost_per_day got 100 grants, each of which could cost up to its reservation (the worst case
-- of one response, migration 0080). Now a grant counts the reservations of the tenant's calls
-- granted and not yet settled: a call whose reservation would carry the settled spend plus the
-- reservations in flight past the budget waits (budget_reserved) while another call of the
-- tenant is in flight (those may settle lower than reserved); alone it goes, as a run's one step
-- always could. So settled + reserved never passes the budget by more than one call's
-- reservation, however many runs the tenant has in flight.
--
-- The total is kept on the tenant's budget row (reserved_tokens, reserved_cost), under the row
-- lock the grant takes to decide, and each counted reservation is a row of tenant_reservation
-- (the run, the claim it was granted under, its tokens and its priced cost), which a trigger
-- adds to and takes from the total, so the total is the sum of the rows by construction. The
-- grant adds the row; the settle (append_step, record_usage), the reap's charge, a 429, a key
-- error, a deferral and a release remove it in the same transaction. A claim that ends another
-- way with its call unsettled (a refused request ends the run failed through finish_run, which
-- is left alone) leaves its row until a grant that would wait finds it: the rows whose run no
-- longer holds the claim they were granted under are deleted then, and the decision is made
-- again. Only tenants with a budget have a total: the others' grants lock nothing more.

ALTER TABLE runrow.tenant_budget
ADD COLUMN reserved_tokens bigint NOT NULL DEFAULT 0
CONSTRAINT tenant_budget_reserved_tokens_not_negative CHECK (reserved_tokens >= 0),
ADD COLUMN reserved_cost numeric NOT NULL DEFAULT 0
CONSTRAINT tenant_budget_reserved_cost_not_negative CHECK (reserved_cost >= 0);

COMMENT ON COLUMN runrow.tenant_budget.reserved_tokens IS
'The tokens reserved by the tenant''s granted, unsettled model calls (the sum of its '
'tenant_reservation rows, kept by their trigger): acquire_model_call counts them with the '
'settled spend.';
COMMENT ON COLUMN runrow.tenant_budget.reserved_cost IS
'The USD (at model_price when granted) reserved by the tenant''s granted, unsettled model '
'calls (the sum of its tenant_reservation rows, kept by their trigger).';

CREATE TABLE runrow.tenant_reservation (
    run_id uuid PRIMARY KEY,
    -- A budget removed takes its reservations with it: a budget set again counts from its
    -- next grant.
    fairness_key text NOT NULL REFERENCES runrow.tenant_budget (fairness_key) ON DELETE CASCADE,
    claim_token uuid NOT NULL,
    tokens bigint NOT NULL CONSTRAINT tenant_reservation_tokens_not_negative CHECK (tokens >= 0),
    cost numeric NOT NULL CONSTRAINT tenant_reservation_cost_not_negative CHECK (cost >= 0)
);

CREATE INDEX tenant_reservation_by_tenant ON runrow.tenant_reservation (fairness_key);

COMMENT ON TABLE runrow.tenant_reservation IS
'A model call of a budgeted tenant granted (acquire_model_call) and not yet settled: its '
'reservation (input estimate + max_tokens tokens, priced as uncached input and output) counted '
'in tenant_budget.reserved_tokens and reserved_cost. Removed when the call settles, is charged '
'at the reap, is refused (a 429, a key error) or its run is deferred or released; a row whose '
'run no longer holds claim_token is stale, and deleted by the next grant that would wait.';

-- The total follows the rows. No SET clause (migration 0041): every name is qualified. The
-- writers lock the tenant's budget row before they write a row (_tenant_reserve,
-- _tenant_unreserve), so this update never waits crosswise with another.
CREATE FUNCTION runrow._tenant_reservation_total() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
    IF tg_op = 'UPDATE' AND new.fairness_key = old.fairness_key THEN
        UPDATE runrow.tenant_budget AS b
        SET reserved_tokens = b.reserved_tokens + new.tokens - old.tokens,
            reserved_cost = b.reserved_cost + new.cost - old.cost
        WHERE b.fairness_key = new.fairness_key;
        RETURN NULL;
    END IF;
    IF tg_op <> 'INSERT' THEN
        UPDATE runrow.tenant_budget AS b
        SET reserved_tokens = b.reserved_tokens - old.tokens, reserved_cost = b.reserved_cost - old.cost
        WHERE b.fairness_key = old.fairness_key;
    END IF;
    IF tg_op <> 'DELETE' THEN
        UPDATE runrow.tenant_budget AS b
        SET reserved_tokens = b.reserved_tokens + new.tokens, reserved_cost = b.reserved_cost + new.cost
        WHERE b.fairness_key = new.fairness_key;
    END IF;
    RETURN NULL;
END
$fn$;

COMMENT ON FUNCTION runrow._tenant_reservation_total() IS
'Trigger of tenant_reservation: keeps tenant_budget.reserved_tokens and reserved_cost the sum '
'of the tenant''s rows.';

REVOKE ALL ON FUNCTION runrow._tenant_reservation_total() FROM PUBLIC;

CREATE TRIGGER tenant_reservation_total
AFTER INSERT OR UPDATE OR DELETE ON runrow.tenant_reservation
FOR EACH ROW EXECUTE FUNCTION runrow._tenant_reservation_total();

-- The calls of budgeted tenants in flight as this migration runs are counted at once: the
-- first grant after it decides with them.
WITH in_flight AS (
    -- Written by acquire_model_call alone, as two whole numbers (functions/ is not applied yet).
    SELECT
        a.id,
        a.fairness_key,
        a.claim_token,
        a.model,
        (a.model_call_reserved ->> 'input_tokens')::bigint AS input_tokens,
        (a.model_call_reserved ->> 'output_tokens')::bigint AS output_tokens
    FROM runrow.agent_run AS a
    INNER JOIN runrow.tenant_budget AS b ON a.fairness_key = b.fairness_key
    WHERE
        a.status = 'running'
        AND a.model_call_reserved IS NOT NULL
        AND a.model_call_attempt = a.attempt
)

INSERT INTO runrow.tenant_reservation (run_id, fairness_key, claim_token, tokens, cost)
SELECT
    f.id AS run_id,
    f.fairness_key,
    f.claim_token,
    f.input_tokens + f.output_tokens AS tokens,
    coalesce((f.input_tokens * p.input_per_mtok + f.output_tokens * p.output_per_mtok) / 1000000, 0) AS cost
FROM in_flight AS f
LEFT JOIN runrow.model_price AS p ON f.model = p.model;

-- 0073: the auditor reads what it is granted; a claim token is a capability, not to be read.
GRANT SELECT (run_id, fairness_key, tokens, cost) ON runrow.tenant_reservation TO runrow_auditor;
