-- update_tenant_budget: the budgets given replace the tenant's, the ones left NULL keep theirs
-- (none for a new tenant). Happy path, who may call it, bad input (nothing written). The
-- concurrent update of the other budget is tests/test_fleet_limits_cli.py's (two sessions).
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(16);

CREATE FUNCTION pg_temp.budget(key text) RETURNS text LANGUAGE sql AS $$
    SELECT (b.tokens_per_day, b.cost_per_day)::text FROM runrow.tenant_budget AS b WHERE b.fairness_key = key
$$;
CREATE FUNCTION pg_temp.budgets_fingerprint() RETURNS text LANGUAGE sql AS $$
    SELECT md5(coalesce(string_agg(to_jsonb(b)::text, '' ORDER BY b.fairness_key), '')) FROM runrow.tenant_budget AS b
$$;

-- Happy path: a new tenant gets what is given and nothing else; each later call changes only
-- what it names.
SELECT lives_ok($$SELECT runrow.update_tenant_budget('upd-acme', tokens_per_day => 2000000)$$, 'a new tenant, tokens only');
SELECT is(pg_temp.budget('upd-acme'), '(2000000,)', 'its cost is not limited');
SELECT lives_ok($$SELECT runrow.update_tenant_budget('upd-acme', cost_per_day => 25)$$, 'then its cost only');
SELECT is(pg_temp.budget('upd-acme'), '(2000000,25)', 'its tokens per day stay');
SELECT lives_ok($$SELECT runrow.update_tenant_budget('upd-acme', 3000000, NULL)$$, 'then its tokens only');
SELECT is(pg_temp.budget('upd-acme'), '(3000000,25)', 'its cost per day stays');
SELECT lives_ok($$SELECT runrow.update_tenant_budget('upd-acme', 1, 0.5)$$, 'both at once');
SELECT is(pg_temp.budget('upd-acme'), '(1,0.5)', 'both replaced');
SELECT is((SELECT over_budget FROM runrow.tenant_budgets WHERE fairness_key = 'upd-acme'), false,
    'the view shows it as set_tenant_budget''s');

-- Who may call it: the owner only, as set_tenant_budget (runrow_client sets no budgets).
SELECT throws_ok($$SELECT pg_temp.as_role('runrow_client', 'SELECT runrow.update_tenant_budget(''upd-acme'', 5)')$$,
    '42501', NULL, 'runrow_client may not change a budget');

-- Bad input: named by its argument, nothing written.
SELECT pg_temp.budgets_fingerprint() AS before \gset
SELECT throws_ok($$SELECT runrow.update_tenant_budget('upd-acme')$$, '22004',
    'tokens_per_day or cost_per_day must be given: NULL keeps that budget as it is '
    '(set_tenant_budget(fairness_key, NULL, NULL) removes the tenant''s budget)', 'nothing to change');
SELECT throws_ok($$SELECT runrow.update_tenant_budget(NULL, 5)$$, '22004', 'fairness_key must not be NULL',
    'a NULL tenant');
SELECT throws_ok($$SELECT runrow.update_tenant_budget('upd-acme', -1)$$, '22023',
    'tokens_per_day must be NULL or a finite number more than 0, got -1', 'a negative token budget');
SELECT throws_ok($$SELECT runrow.update_tenant_budget('upd-acme', NULL, 'NaN')$$, '22023',
    'cost_per_day must be NULL or a finite number more than 0, got NaN', 'a NaN cost budget');
SELECT throws_ok(format('SELECT runrow.update_tenant_budget(%L, 5)', E'upd\u202eevil'), '22023', NULL,
    'an unprintable tenant');
SELECT is(pg_temp.budgets_fingerprint(), :'before', 'bad input wrote nothing');

SELECT * FROM finish();
ROLLBACK;
