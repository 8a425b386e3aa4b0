-- lapsed_claim_token (migration 0102) is the token of a lease that lapsed into a dead letter: it
-- is kept only while no lease is held and the delivery is dead or re-armed (pending), never
-- beside a claim token nor on a delivered row. That was held by its writers only; since 0106 a
-- CHECK constraint (webhook_delivery_lapsed_token) holds it for every writer (the SQL review of
-- 0102, F7). Rows are written directly, as the tests' role (the owner's rights).
BEGIN;
\ir helpers/setup.psql
SELECT plan(8);
SELECT pg_temp.drain_queue();
UPDATE runrow.webhook_delivery SET state = 'dead', claim_token = NULL, claim_expires_at = NULL
WHERE state = 'pending';

SELECT e.run_id AS run FROM runrow.enqueue_run(
    conversation_id => gen_random_uuid(), content => '"hello"', model => 'test-model',
    webhook_url => 'http://lapsed.example/hook') AS e \gset
SELECT runrow.cancel_run(:'run');
SELECT w.id AS d FROM runrow.webhook_delivery AS w WHERE w.run_id = :'run' \gset

SELECT ok(EXISTS (SELECT 1 FROM pg_constraint
        WHERE conrelid = 'runrow.webhook_delivery'::regclass AND conname = 'webhook_delivery_lapsed_token'
          AND contype = 'c'), 'webhook_delivery has the CHECK constraint webhook_delivery_lapsed_token');

-- Allowed: dead or pending with no lease.
SELECT lives_ok($$UPDATE runrow.webhook_delivery SET state = 'dead', lapsed_claim_token = gen_random_uuid()
    WHERE id = '$$ || :'d' || $$'$$, 'a dead letter with no lease may keep a lapsed token');
SELECT lives_ok($$UPDATE runrow.webhook_delivery SET state = 'pending' WHERE id = '$$ || :'d' || $$'$$,
    're-armed (pending, no lease), it may keep it');

-- Refused: beside a lease, or on a delivered row.
SELECT throws_ok($$UPDATE runrow.webhook_delivery
    SET claim_token = gen_random_uuid(), claim_expires_at = now() + interval '20 seconds'
    WHERE id = '$$ || :'d' || $$'$$, '23514',
    'new row for relation "webhook_delivery" violates check constraint "webhook_delivery_lapsed_token"',
    'a lease beside a lapsed token is refused (23514)');
SELECT throws_ok($$UPDATE runrow.webhook_delivery SET state = 'delivered', delivered_at = now()
    WHERE id = '$$ || :'d' || $$'$$, '23514',
    'new row for relation "webhook_delivery" violates check constraint "webhook_delivery_lapsed_token"',
    'a delivered row keeping a lapsed token is refused (23514)');
SELECT is((SELECT (state, claim_token IS NULL, lapsed_claim_token IS NOT NULL)::text
        FROM runrow.webhook_delivery WHERE id = :'d'), '(pending,t,t)', 'and nothing was written');

-- What the functions write stays allowed: a new attempt's claim clears the lapsed token.
SELECT lives_ok($$SELECT runrow.claim_webhook_deliveries('w', 100, 20, 5, 100)$$,
    'a claim of the re-armed delivery is allowed');
SELECT is((SELECT (claim_token IS NOT NULL, lapsed_claim_token IS NULL)::text
        FROM runrow.webhook_delivery WHERE id = :'d'), '(t,t)', 'its new lease replaced the lapsed token');

SELECT * FROM finish();
ROLLBACK;
