-- runrow._lease_webhook_deliveries, the lease claim_webhook_deliveries makes for one receiver
-- under its advisory lock: at most max_n, at most the receiver's room under max_per_receiver
-- (its unexpired leases counted over the whole table), only the ids given that are still due,
-- in due order; a delivery that used max_attempts (its last worker died) dead-lettered and not
-- returned. Private: not callable by the runrow roles.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(10);
SELECT pg_temp.drain_queue();
UPDATE runrow.webhook_delivery SET state = 'dead', claim_token = NULL, claim_expires_at = NULL
WHERE state = 'pending';

-- Five ended runs to one receiver: five due deliveries, the oldest first.
SELECT runrow.enqueue_run(conversation_id => gen_random_uuid(), content => '"hi"', model => 'test-model',
    webhook_url => 'https://lease.example/hook')
FROM generate_series(1, 5);
SELECT runrow.finish_run(c.run_id, c.claim_token, 'completed') FROM runrow.claim_runs('pgtap', 5, 60) AS c;
UPDATE runrow.webhook_delivery AS w SET next_attempt_at = now() - make_interval(secs => r.n)
FROM (SELECT v.id, row_number() OVER (ORDER BY v.id) AS n FROM runrow.webhook_delivery AS v
      WHERE v.url = 'https://lease.example/hook') AS r
WHERE w.id = r.id;
CREATE TEMP TABLE due AS
SELECT array_agg(w.id ORDER BY w.next_attempt_at) AS ids FROM runrow.webhook_delivery AS w
WHERE w.url = 'https://lease.example/hook';
CREATE FUNCTION pg_temp.lease(max_n int, per_receiver int, max_attempts int DEFAULT 8) RETURNS SETOF uuid
LANGUAGE sql AS $$
    SELECT l.delivery_id FROM runrow._lease_webhook_deliveries(
        'https://lease.example:443', (SELECT ids FROM due), max_n, 'w1', 30, max_attempts, per_receiver) AS l
$$;

SELECT is_empty($$SELECT 1 FROM pg_proc AS p WHERE p.oid = 'runrow._lease_webhook_deliveries'::regproc
    AND (has_function_privilege('runrow_worker', p.oid, 'EXECUTE')
         OR has_function_privilege('runrow_client', p.oid, 'EXECUTE'))$$,
    'private: neither role may call it');

-- max_n bounds it, and the oldest due go first, with a lease each.
SELECT is((SELECT array_agg(x ORDER BY x) FROM pg_temp.lease(2, 4) AS x),
    (SELECT array_agg(i ORDER BY i) FROM due, unnest(ids[1:2]) AS i), 'max_n = 2: the two oldest due deliveries');
SELECT is((SELECT count(*)::int FROM runrow.webhook_delivery AS w
           WHERE w.id = ANY ((SELECT ids[1:2] FROM due)::uuid[]) AND w.claim_token IS NOT NULL
             AND w.claim_expires_at = now() + interval '30 seconds' AND w.attempts = 1
             AND w.worker_id = 'w1' AND w.next_attempt_at = now() + interval '30 seconds'),
    2, 'each leased for lease_seconds, attempt counted, worker named, due again when the lease ends');

-- The receiver's room: 2 leases out of max_per_receiver 3 leaves one, whatever max_n says.
SELECT is((SELECT count(*)::int FROM pg_temp.lease(10, 3)), 1, 'room for one more under max_per_receiver 3');
SELECT is((SELECT count(*)::int FROM pg_temp.lease(10, 3)), 0, 'a full receiver: nothing');
-- The leased ids are no longer due: asked again with room, only the two left are leased.
SELECT is((SELECT count(*)::int FROM pg_temp.lease(10, 100)), 2, 'only the ids still due are leased');
SELECT is((SELECT count(*)::int FROM runrow.webhook_delivery AS w
           WHERE w.id = ANY ((SELECT ids FROM due)::uuid[]) AND w.claim_token IS NOT NULL), 5, 'all five leased once');

-- A lease that lapsed with its attempts used: dead-lettered, not returned, its lapse recorded.
UPDATE runrow.webhook_delivery AS w SET claim_expires_at = now() - interval '1 second',
    next_attempt_at = now() - interval '1 second', attempts = 3
WHERE w.id = (SELECT ids[1] FROM due);
SELECT is((SELECT count(*)::int FROM pg_temp.lease(10, 100, 3)), 0, 'its last attempt used: not returned');
SELECT is((SELECT (state, claim_token IS NULL, attempts)::text FROM runrow.webhook_delivery
           WHERE id = (SELECT ids[1] FROM due)), '(dead,t,3)', 'dead-lettered, the token cleared');
SELECT matches((SELECT last_error FROM runrow.webhook_delivery WHERE id = (SELECT ids[1] FROM due)),
    '^lease expired: worker w1 recorded no outcome of attempt 3$', 'the lapse is its last error');

SELECT * FROM finish();
ROLLBACK;
