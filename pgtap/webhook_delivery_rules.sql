-- webhook_delivery's row rules (migration 0058): one CHECK constraint, webhook_delivery_rules,
-- whose expression calls runrow._webhook_delivery_rules_valid. Each rule refuses its row with
-- the error and constraint name the nine CHECKs it replaced gave, in their (name) order; a NULL
-- passes, as in a CHECK. Rows are written directly, as the tests' role (the owner's rights):
-- the rules bind everyone, not only the delivery functions.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(17);
SELECT pg_temp.drain_queue();

SELECT results_eq(
    $$SELECT conname::text COLLATE "default", convalidated FROM pg_constraint
      WHERE conrelid = 'runrow.webhook_delivery'::regclass AND contype = 'c' ORDER BY conname$$,
    $$VALUES ('webhook_delivery_lapsed_token', true), ('webhook_delivery_rules', true)$$,
    'webhook_delivery''s row rules are one CHECK constraint, validated (and 0106''s, on lapsed_claim_token, '
    'validated by 0111)');
SELECT ok(pg_get_constraintdef((SELECT oid FROM pg_constraint WHERE conname = 'webhook_delivery_rules'))
    ~ '^CHECK \(runrow\._webhook_delivery_rules_valid\(', 'its expression is one call of _webhook_delivery_rules_valid');
SELECT ok(NOT has_function_privilege('runrow_worker', 'runrow._webhook_delivery_rules_valid(text, jsonb, text, integer, '
    'uuid, timestamptz, text, integer, timestamptz)', 'EXECUTE'), 'no runrow role may call the function itself');

-- A valid pending delivery; each case below changes what its name says.
CREATE FUNCTION pg_temp.rule(
    url text DEFAULT 'https://hooks.example/x', payload jsonb DEFAULT '{}', state text DEFAULT 'pending',
    attempts int DEFAULT 0, claim_token uuid DEFAULT NULL, claim_expires_at timestamptz DEFAULT NULL,
    last_error text DEFAULT NULL, last_http_status int DEFAULT NULL, delivered_at timestamptz DEFAULT NULL
) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    name text;
BEGIN
    PERFORM runrow._webhook_delivery_rules_valid(url, payload, state, attempts, claim_token, claim_expires_at,
        last_error, last_http_status, delivered_at);
    RETURN 'valid';
EXCEPTION WHEN check_violation THEN
    GET STACKED DIAGNOSTICS name = CONSTRAINT_NAME;
    RETURN name;
END
$fn$;
SELECT is(pg_temp.rule(), 'valid', 'a pending delivery is valid');
SELECT is(pg_temp.rule(state => 'delivered', delivered_at => now(), last_http_status => 204), 'valid',
    'a delivered one is valid');
SELECT is(pg_temp.rule(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL), 'valid', 'NULLs pass, as in a CHECK');
SELECT is(pg_temp.rule(attempts => -1), 'webhook_delivery_attempts_check', 'attempts -1');
SELECT is(pg_temp.rule(state => 'delivered'), 'webhook_delivery_delivered_at', 'delivered without a time');
SELECT is(pg_temp.rule(last_error => repeat('e', 10001)), 'webhook_delivery_last_error_check',
    'an error of 10,001 characters');
SELECT is(pg_temp.rule(last_http_status => 99), 'webhook_delivery_last_http_status_check', 'HTTP status 99');
SELECT is(pg_temp.rule(state => 'dead', claim_token => gen_random_uuid(), claim_expires_at => now()),
    'webhook_delivery_lease_only_pending', 'a dead delivery with a lease');
SELECT is(pg_temp.rule(claim_token => gen_random_uuid()), 'webhook_delivery_lease_whole', 'a token without its expiry');
SELECT is(pg_temp.rule(payload => '[]'), 'webhook_delivery_payload_check', 'a payload that is not an object');
SELECT is(pg_temp.rule(state => 'sent'), 'webhook_delivery_state_check', 'an unknown state');
SELECT is(pg_temp.rule(url => 'ftp://hooks.example/x'), 'webhook_delivery_url_check', 'an ftp URL');
SELECT is(pg_temp.rule(url => 'https://x', attempts => -1, payload => '1'), 'webhook_delivery_attempts_check',
    'of two broken rules the first by name is reported, as PostgreSQL orders CHECKs');

-- The constraint binds direct writes, with the message a failed CHECK gives.
SELECT pg_temp.running() AS r \gset
SELECT throws_ok(format($$INSERT INTO runrow.webhook_delivery (id, run_id, url, payload)
        VALUES (gen_random_uuid(), %L, 'https://hooks.example/ x', '{}')$$, :'r'),
    '23514', 'new row for relation "webhook_delivery" violates check constraint "webhook_delivery_url_check"',
    'a direct INSERT with a URL holding a space is refused');

SELECT * FROM finish();
ROLLBACK;
