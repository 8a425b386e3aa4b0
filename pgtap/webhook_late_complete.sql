-- A delivery whose last attempt's lease lapsed before its sender recorded the receiver's 2xx is
-- dead-lettered by the next claim. The sender that held exactly that lease may still record
-- it delivered (lapsed_claim_token, migration 0102), so a person does not re-arm a delivery the
-- receiver already has; no other token may, and not once a new attempt was claimed.
BEGIN;
\ir helpers/setup.psql
SELECT plan(28);
SELECT pg_temp.drain_queue();
-- Deliveries left by other files' data must not be claimed here.
UPDATE runrow.webhook_delivery SET state = 'dead', claim_token = NULL, claim_expires_at = NULL
WHERE state = 'pending';

-- A pending delivery (its run cancelled while queued), never tried.
CREATE FUNCTION pg_temp.delivery_of_new_run() RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    run uuid;
BEGIN
    SELECT e.run_id INTO run FROM runrow.enqueue_run(
        conversation_id => gen_random_uuid(), content => '"hello"', model => 'test-model',
        webhook_url => 'http://late.example/hook') AS e;
    PERFORM runrow.cancel_run(run);
    RETURN (SELECT w.id FROM runrow.webhook_delivery AS w WHERE w.run_id = run);
END $$;
-- Claim delivery d (all others due are out of the way) with max_attempts; its token, or NULL
-- when the claim handed it out no more.
CREATE FUNCTION pg_temp.claim_delivery(d uuid, max_attempts int) RETURNS uuid LANGUAGE sql AS $$
    SELECT c.claim_token FROM runrow.claim_webhook_deliveries('w', 100, 20, max_attempts, 100) AS c
    WHERE c.delivery_id = d
$$;
-- As if the lease had lapsed a minute ago (the owner may write the table in a test).
CREATE FUNCTION pg_temp.lapse(d uuid) RETURNS void LANGUAGE sql AS $$
    UPDATE runrow.webhook_delivery
    SET claim_expires_at = now() - interval '1 minute', next_attempt_at = now() - interval '1 minute'
    WHERE id = d
$$;
CREATE FUNCTION pg_temp.row_of(d uuid) RETURNS runrow.webhook_delivery LANGUAGE sql AS $$
    SELECT * FROM runrow.webhook_delivery WHERE id = d
$$;
CREATE FUNCTION pg_temp.outbox() RETURNS text LANGUAGE sql AS $$
    SELECT md5(coalesce(string_agg(w.ctid::text || to_jsonb(w)::text, ',' ORDER BY w.id), ''))
    FROM runrow.webhook_delivery AS w
$$;

-- Happy path: the holder of a live lease completes it.
SELECT pg_temp.delivery_of_new_run() AS ok_d \gset
SELECT pg_temp.claim_delivery(:'ok_d', 1) AS ok_k \gset
SELECT ok(runrow.complete_webhook_delivery(:'ok_d', :'ok_k', 200), 'the lease''s holder completes its delivery');
SELECT is((pg_temp.row_of(:'ok_d')).state, 'delivered', 'delivered');

-- The last attempt's lease lapses and the next claim dead-letters it.
SELECT pg_temp.delivery_of_new_run() AS late_d \gset
SELECT pg_temp.claim_delivery(:'late_d', 1) AS late_k \gset
SELECT pg_temp.lapse(:'late_d');
SELECT is(pg_temp.claim_delivery(:'late_d', 1), NULL, 'the lapsed last attempt is not handed out again');
SELECT is(((pg_temp.row_of(:'late_d')).state, (pg_temp.row_of(:'late_d')).claim_token IS NULL)::text, '(dead,t)',
    'it is dead-lettered, its lease gone');
SELECT is((pg_temp.row_of(:'late_d')).lapsed_claim_token, :'late_k'::uuid, 'the lapsed lease''s token is kept');
SELECT pg_temp.outbox() AS before \gset
SELECT is(runrow.complete_webhook_delivery(:'late_d', gen_random_uuid(), 200), false, 'a foreign token is fenced out');
SELECT is(runrow.complete_webhook_delivery(:'late_d', :'ok_k', 200), false,
    'so is another delivery''s token');
SELECT is(runrow.fail_webhook_delivery(:'late_d', :'late_k', 'late failure'), NULL,
    'a late failure from the lapsed lease is fenced out: the delivery stays dead');
SELECT is(pg_temp.outbox(), :'before', 'none of them wrote anything');
SELECT ok(runrow.complete_webhook_delivery(:'late_d', :'late_k', 204),
    'the sender that held the lapsed lease records its late 2xx');
SELECT is(((pg_temp.row_of(:'late_d')).state, (pg_temp.row_of(:'late_d')).delivered_at = now(),
           (pg_temp.row_of(:'late_d')).last_http_status, (pg_temp.row_of(:'late_d')).lapsed_claim_token IS NULL)::text,
    '(delivered,t,204,t)', 'the dead letter is delivered, with its status, the kept token cleared');
SELECT is(runrow.retry_webhook_delivery(:'late_d'), false, 'so nobody can re-arm it into a duplicate');
SELECT is(runrow.complete_webhook_delivery(:'late_d', :'late_k', 200), false, 'a second late complete is a no-op');

-- Only the last lease's token: an earlier attempt's lease, taken over, stays fenced out.
SELECT pg_temp.delivery_of_new_run() AS two_d \gset
SELECT pg_temp.claim_delivery(:'two_d', 2) AS two_k1 \gset
SELECT pg_temp.lapse(:'two_d');
SELECT pg_temp.claim_delivery(:'two_d', 2) AS two_k2 \gset
SELECT isnt(:'two_k2'::uuid, :'two_k1'::uuid, 'a lapsed lease with attempts left is taken over with a new token');
SELECT is((pg_temp.row_of(:'two_d')).lapsed_claim_token, NULL, 'and keeps no lapsed token: the new one is the only one');
SELECT pg_temp.lapse(:'two_d');
SELECT is(pg_temp.claim_delivery(:'two_d', 2), NULL, 'the second lapsed lease is the last: dead-lettered');
SELECT pg_temp.outbox() AS before \gset
SELECT is(runrow.complete_webhook_delivery(:'two_d', :'two_k1', 200), false,
    'the first attempt''s token, taken over, is still fenced out');
SELECT is(pg_temp.outbox(), :'before', 'and wrote nothing');
SELECT ok(runrow.complete_webhook_delivery(:'two_d', :'two_k2', 200), 'the last attempt''s token records it');

-- Re-armed: the lapsed lease's sender may still say so until a new attempt is claimed.
SELECT pg_temp.delivery_of_new_run() AS rearm_d \gset
SELECT pg_temp.claim_delivery(:'rearm_d', 1) AS rearm_k \gset
SELECT pg_temp.lapse(:'rearm_d');
SELECT pg_temp.claim_delivery(:'rearm_d', 1);
SELECT ok(runrow.retry_webhook_delivery(:'rearm_d'), 're-armed by a person');
SELECT ok(runrow.complete_webhook_delivery(:'rearm_d', :'rearm_k', 200),
    'before a new claim, the late 2xx still records it: the claim that would duplicate it finds nothing');
SELECT is(pg_temp.claim_delivery(:'rearm_d', 1), NULL, 'and it is not sent again');

SELECT pg_temp.delivery_of_new_run() AS new_d \gset
SELECT pg_temp.claim_delivery(:'new_d', 1) AS new_k1 \gset
SELECT pg_temp.lapse(:'new_d');
SELECT pg_temp.claim_delivery(:'new_d', 1);
SELECT runrow.retry_webhook_delivery(:'new_d');
SELECT pg_temp.claim_delivery(:'new_d', 1) AS new_k2 \gset
SELECT pg_temp.outbox() AS before \gset
SELECT is(runrow.complete_webhook_delivery(:'new_d', :'new_k1', 200), false,
    'once a new attempt is claimed, the lapsed token is fenced out');
SELECT is(pg_temp.outbox(), :'before', 'and wrote nothing');

-- Bad input: named, nothing written, the kept token kept.
SELECT pg_temp.delivery_of_new_run() AS bad_d \gset
SELECT pg_temp.claim_delivery(:'bad_d', 1) AS bad_k \gset
SELECT pg_temp.lapse(:'bad_d');
SELECT pg_temp.claim_delivery(:'bad_d', 1);
SELECT pg_temp.outbox() AS before \gset
SELECT throws_ok(format('SELECT runrow.complete_webhook_delivery(%L, NULL, 200)', :'bad_d'), '22004',
    'claim_token must not be NULL', 'claim_token NULL');
SELECT throws_ok(format('SELECT runrow.complete_webhook_delivery(%L, %L, 500)', :'bad_d', :'bad_k'), '22023',
    'http_status must be between 200 and 299, got 500', 'a non-2xx http_status, even with the kept token');
SELECT is(pg_temp.outbox(), :'before', 'bad input wrote nothing');
SELECT is(((pg_temp.row_of(:'bad_d')).state, (pg_temp.row_of(:'bad_d')).lapsed_claim_token)::text,
    format('(dead,%s)', :'bad_k'), 'the dead letter still holds its lapsed token');

SELECT * FROM finish();
ROLLBACK;
