CREATE OR REPLACE FUNCTION runrow.set_fairness_weight(fairness_key text, weight double precision)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    PERFORM runrow._require_key(set_fairness_weight.fairness_key, 'fairness_key');
    -- A reset (weight NULL) of a key stored before migration 0085 is let through, as the other
    -- setters let such a key be removed.
    IF set_fairness_weight.weight IS NOT NULL THEN
        PERFORM runrow._require_printable(set_fairness_weight.fairness_key, 'fairness_key');
    END IF;
    IF set_fairness_weight.weight IS NOT NULL
       AND NOT (set_fairness_weight.weight >= 0.001 AND set_fairness_weight.weight <= 1000) THEN
        -- The floor keeps the claim's 1 / weight a finite, small step (migration 0064).
        RAISE EXCEPTION 'weight must be NULL or from 0.001 to 1000, got %', set_fairness_weight.weight
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO runrow.fairness_tenant AS f (fairness_key, weight)
    VALUES (coalesce(set_fairness_weight.fairness_key, ''), coalesce(set_fairness_weight.weight, 1))
    ON CONFLICT ON CONSTRAINT fairness_tenant_pkey DO UPDATE
    SET weight = excluded.weight, updated_at = now();
END
$fn$;

COMMENT ON FUNCTION runrow.set_fairness_weight(text, double precision) IS
'Weight of a tenant (fairness_key, 1..200 characters; NULL = the anonymous tenant) in the '
'claim''s fair share within a priority level: a tenant of weight 2 is claimed twice as often as '
'one of weight 1 while both have claimable runs. weight from 0.001 to 1000; NULL '
'resets it to 1, the default of every tenant. Bad input raises 22023 naming the argument and '
'writes nothing.';

REVOKE ALL ON FUNCTION runrow.set_fairness_weight(text, double precision) FROM PUBLIC;
