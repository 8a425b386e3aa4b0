-- The webhook outbox: every ending of a run that names a webhook_url writes one delivery row
-- in the terminal write's own transaction (a trigger on the status change, so no ending path
-- can forget it), and the delivery functions lease, complete, fail with exponential backoff
-- on the database clock, and dead-letter, each fenced by its claim token.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(108);
SELECT pg_temp.drain_queue();
-- Deliveries left by other files' data must not be claimed here.
UPDATE runrow.webhook_delivery SET state = 'dead', claim_token = NULL, claim_expires_at = NULL
WHERE state = 'pending';

\set hook '''http://127.0.0.1:9/hook'''

CREATE FUNCTION pg_temp.hooked(attempts int DEFAULT 1) RETURNS uuid LANGUAGE sql AS $$
    SELECT run_id FROM runrow.enqueue_run(
        conversation_id => gen_random_uuid(), content => '"hello"', model => 'test-model',
        max_attempts => attempts, webhook_url => 'http://127.0.0.1:9/hook')
$$;
CREATE FUNCTION pg_temp.deliveries(run uuid) RETURNS int LANGUAGE sql AS $$
    SELECT count(*)::int FROM runrow.webhook_delivery WHERE run_id = run
$$;
CREATE FUNCTION pg_temp.delivery(run uuid) RETURNS runrow.webhook_delivery LANGUAGE sql AS $$
    SELECT * FROM runrow.webhook_delivery WHERE run_id = run
$$;
-- Every version of every delivery row: a fenced-out call must leave it unchanged.
CREATE FUNCTION pg_temp.outbox() RETURNS text LANGUAGE sql AS $$
    SELECT md5(coalesce(string_agg(w.ctid::text || to_jsonb(w)::text, ',' ORDER BY w.id), ''))
    FROM runrow.webhook_delivery AS w
$$;
-- As if the lease had lapsed `ago` seconds ago (the owner may write the table in a test).
CREATE FUNCTION pg_temp.lapse(d uuid, ago int DEFAULT 60) RETURNS void LANGUAGE sql AS $$
    UPDATE runrow.webhook_delivery
    SET claim_expires_at = now() - make_interval(secs => ago), next_attempt_at = now() - make_interval(secs => ago)
    WHERE id = d
$$;
CREATE FUNCTION pg_temp.due_now(d uuid) RETURNS void LANGUAGE sql AS $$
    UPDATE runrow.webhook_delivery SET next_attempt_at = now() - interval '1 second' WHERE id = d
$$;

-- Signatures, grants, contracts.
SELECT has_function('runrow', 'claim_webhook_deliveries', '{text,integer,integer,integer,integer}'::name[],
    'claim_webhook_deliveries(worker_id, max_deliveries, lease_seconds, max_attempts, max_per_receiver) exists');
SELECT has_function('runrow', 'complete_webhook_delivery', '{uuid,uuid,integer}'::name[],
    'complete_webhook_delivery(delivery_id, claim_token, http_status) exists');
SELECT has_function('runrow', 'fail_webhook_delivery', '{uuid,uuid,text,integer,integer,numeric,boolean}'::name[],
    'fail_webhook_delivery(delivery_id, claim_token, error, http_status, max_attempts, backoff_seconds, permanent) exists');
SELECT has_function('runrow', 'retry_webhook_delivery', '{uuid}'::name[], 'retry_webhook_delivery(delivery_id) exists');
SELECT function_privs_are('runrow', f, a::name[], 'runrow_worker', ARRAY['EXECUTE'], 'runrow_worker may call ' || f)
FROM (VALUES ('claim_webhook_deliveries', '{text,integer,integer,integer,integer}'),
             ('complete_webhook_delivery', '{uuid,uuid,integer}'),
             ('fail_webhook_delivery', '{uuid,uuid,text,integer,integer,numeric,boolean}')) AS v (f, a);
SELECT function_privs_are('runrow', f, a::name[], 'runrow_client', ARRAY[]::name[], 'runrow_client may not call ' || f)
FROM (VALUES ('claim_webhook_deliveries', '{text,integer,integer,integer,integer}'),
             ('complete_webhook_delivery', '{uuid,uuid,integer}'),
             ('fail_webhook_delivery', '{uuid,uuid,text,integer,integer,numeric,boolean}')) AS v (f, a);
SELECT function_privs_are('runrow', 'retry_webhook_delivery', '{uuid}'::name[], 'runrow_client', ARRAY['EXECUTE'],
    'runrow_client may retry a dead-lettered delivery');
SELECT function_privs_are('runrow', 'retry_webhook_delivery', '{uuid}'::name[], 'runrow_worker', ARRAY[]::name[],
    'runrow_worker may not');
SELECT is_empty($$SELECT p.proname FROM pg_proc AS p WHERE p.pronamespace = 'runrow'::regnamespace
    AND p.proname LIKE '%webhook%' AND p.proname NOT LIKE '\_%' AND obj_description(p.oid, 'pg_proc') IS NULL$$,
    'every webhook function has a COMMENT stating its contract');

-- Every ending path writes exactly one delivery, in the ending's own transaction.
SELECT pg_temp.hooked() AS done \gset
SELECT pg_temp.claim(:'done') AS tok \gset
SELECT is(pg_temp.deliveries(:'done'), 0, 'no delivery while the run is running');
SELECT ok(runrow.finish_run(:'done', :'tok', 'completed', '{"text": "hi"}'), 'finish_run completed');
SELECT is(pg_temp.deliveries(:'done'), 1, 'finish_run wrote one delivery');
SELECT is((pg_temp.delivery(:'done')).payload - 'finished_at',
    jsonb_build_object('id', (pg_temp.delivery(:'done')).id, 'type', 'run.ended', 'run_id', :'done'::uuid,
        'conversation_id', (SELECT conversation_id FROM runrow.agent_run WHERE id = :'done'), 'user_id', NULL,
        'status', 'completed', 'attempt', 1, 'result', '{"text": "hi"}'::jsonb, 'error', NULL, 'metadata', '{}'::jsonb),
    'the body names the delivery id, the run, its status, result and error');
SELECT is(((pg_temp.delivery(:'done')).payload ->> 'finished_at')::timestamptz, now(), 'and when it ended');
SELECT is(((pg_temp.delivery(:'done')).state, (pg_temp.delivery(:'done')).attempts,
           (pg_temp.delivery(:'done')).next_attempt_at, (pg_temp.delivery(:'done')).url)::text,
    (('pending', 0, now(), :hook))::text, 'pending, never tried, due at once, to the run''s webhook_url');

SELECT pg_temp.hooked() AS batch \gset
SELECT pg_temp.claim(:'batch') AS btok \gset
SELECT ok((SELECT finished FROM runrow.finish_runs(jsonb_build_array(jsonb_build_object(
    'run_id', :'batch', 'claim_token', :'btok', 'status', 'failed', 'error', 'boom')))), 'finish_runs failed');
SELECT is(((pg_temp.delivery(:'batch')).payload ->> 'status'), 'failed', 'finish_runs wrote the delivery');

SELECT pg_temp.hooked() AS reaped \gset
SELECT pg_temp.claim(:'reaped') AS rtok \gset
SELECT pg_temp.expire(:'reaped');
SELECT is((SELECT outcome FROM runrow.reap_expired_runs(0) WHERE run_id = :'reaped'), 'failed', 'the reaper fails a one-attempt run');
SELECT is(pg_temp.deliveries(:'reaped'), 1, 'the reaper''s ending wrote the delivery');

SELECT pg_temp.hooked(2) AS twice \gset
SELECT pg_temp.claim(:'twice') AS ttok \gset
SELECT is(runrow.release_run(:'twice', :'ttok', 'transient'), 'requeued', 'a release with attempts left requeues');
SELECT is(pg_temp.deliveries(:'twice'), 0, 'a requeue is no ending: no delivery');
SELECT pg_temp.claim(:'twice') AS ttok \gset
SELECT is(runrow.release_run(:'twice', :'ttok', 'again'), 'dead', 'the last attempt released is dead');
SELECT is(pg_temp.deliveries(:'twice'), 1, 'dead wrote one delivery, not one per attempt');
SELECT is((pg_temp.delivery(:'twice')).payload ->> 'status', 'dead', 'with status dead');

SELECT pg_temp.hooked() AS stopped \gset
SELECT is((SELECT action FROM runrow.stop_conversation(
    (SELECT conversation_id FROM runrow.agent_run WHERE id = :'stopped'))), 'cancelled', 'a queued run is stopped');
SELECT is((pg_temp.delivery(:'stopped')).payload ->> 'status', 'cancelled', 'the stop wrote the delivery');

SELECT pg_temp.hooked() AS cancelled \gset
SELECT pg_temp.claim(:'cancelled') AS ctok \gset
SELECT is(runrow.cancel_run(:'cancelled'), 'cancel_requested', 'cancel_run asks the worker to cancel');
SELECT is(pg_temp.deliveries(:'cancelled'), 0, 'asking is not ending');
SELECT ok(runrow.finish_run(:'cancelled', :'ctok', 'cancelled'), 'the worker finalizes cancelled');
SELECT is(pg_temp.deliveries(:'cancelled'), 1, 'and that wrote the delivery');

SELECT pg_temp.finished('completed') AS quiet \gset
SELECT is(pg_temp.deliveries(:'quiet'), 0, 'a run without webhook_url ends without a delivery');
SELECT ok((SELECT count(DISTINCT id) = count(*) FROM runrow.webhook_delivery), 'every delivery has its own id');
SELECT throws_ok(format($$INSERT INTO runrow.webhook_delivery (id, run_id, url, payload)
    VALUES (gen_random_uuid(), %L, 'http://x.test/', '{}')$$, :'done'), '23505', NULL,
    'one delivery per run is a unique key');

SELECT is_empty($$SELECT * FROM runrow.audit() WHERE invariant = 'schema_guard_missing'$$, 'audit: the guards are in place');
-- The outbox is written by agent_run's statement trigger (migration 0042).
ALTER TABLE runrow.agent_run DISABLE TRIGGER agent_run_after_update;
SELECT is((SELECT detail FROM runrow.audit() WHERE invariant = 'schema_guard_missing'),
    'trigger agent_run_after_update on runrow.agent_run is missing, invalid or disabled',
    'audit reports a disabled outbox trigger: runs would end without telling anyone');
ALTER TABLE runrow.agent_run ENABLE TRIGGER agent_run_after_update;

-- Claim: due rows, leased with a fresh token; nobody else gets them while the lease lives.
-- Every delivery of this file goes to one receiver (:hook), so its claims lift the cap on one
-- receiver's leases to 100 (claim_webhook_deliveries_per_receiver.sql tests the cap).
CREATE TEMP TABLE c1 AS SELECT * FROM runrow.claim_webhook_deliveries('w1', 100, 30, 3, 100);
SELECT is((SELECT count(*)::int FROM c1), 6, 'the six pending deliveries are claimed');
SELECT ok((SELECT bool_and(attempt = 1 AND claim_expires_at = now() + interval '30 seconds' AND claimed_at = now()) FROM c1),
    'each as attempt 1 with the lease on the database clock');
SELECT is((SELECT payload FROM c1 WHERE run_id = :'done'), (pg_temp.delivery(:'done')).payload, 'with the body to send');
SELECT is_empty($$SELECT * FROM runrow.claim_webhook_deliveries('w2', 100, 30, 3, 100)$$,
    'a second claimer gets nothing while the leases live');
SELECT (SELECT delivery_id FROM c1 WHERE run_id = :'done') AS d1, (SELECT claim_token FROM c1 WHERE run_id = :'done') AS k1 \gset

-- Complete: delivered, final; a second call is fenced out.
SELECT ok(runrow.complete_webhook_delivery(:'d1', :'k1', 204), 'complete records the success');
SELECT is(((pg_temp.delivery(:'done')).state, (pg_temp.delivery(:'done')).delivered_at,
           (pg_temp.delivery(:'done')).last_http_status, (pg_temp.delivery(:'done')).claim_token)::text,
    (('delivered', now(), 204, NULL::uuid))::text, 'delivered now, with the status, lease cleared');
SELECT pg_temp.outbox() AS before \gset
SELECT is(runrow.complete_webhook_delivery(:'d1', :'k1', 200), false, 'completing twice is fenced out');
SELECT is(runrow.fail_webhook_delivery(:'d1', :'k1', 'late failure'), NULL, 'a late failure after success is fenced out');
SELECT is(pg_temp.outbox(), :'before', 'and neither wrote anything');
SELECT throws_ok(format($$UPDATE runrow.webhook_delivery SET state = 'pending', delivered_at = NULL WHERE id = %L$$, :'d1'),
    '23000', NULL, 'delivered is final in the schema');
SELECT throws_ok(format($$UPDATE runrow.webhook_delivery SET payload = '{}' WHERE id = %L$$,
    (pg_temp.delivery(:'batch')).id), '23000', NULL, 'a body never changes');

-- Fail: exponential backoff on the database clock, then dead after max_attempts.
SELECT (SELECT delivery_id FROM c1 WHERE run_id = :'batch') AS d2, (SELECT claim_token FROM c1 WHERE run_id = :'batch') AS k2 \gset
-- Jitter: twenty failures of the same attempt (each undone) do not all come back at once.
CREATE FUNCTION pg_temp.backoffs(d uuid, k uuid) RETURNS double precision[] LANGUAGE plpgsql AS $$
DECLARE
    got double precision[] := '{}';
    secs double precision;
BEGIN
    FOR i IN 1..20 LOOP
        BEGIN
            PERFORM runrow.fail_webhook_delivery(d, k, 'HTTP 500', 500, 3, 2);
            SELECT extract(EPOCH FROM w.next_attempt_at - now()) INTO secs FROM runrow.webhook_delivery AS w WHERE w.id = d;
            got := got || secs;
            RAISE EXCEPTION 'undone' USING ERRCODE = 'P0001';
        EXCEPTION WHEN raise_exception THEN
            NULL;
        END;
    END LOOP;
    RETURN got;
END $$;
SELECT pg_temp.backoffs(:'d2', :'k2') AS tries \gset
SELECT ok((SELECT count(DISTINCT x) > 10 AND min(x) >= 2 AND max(x) <= 3 FROM unnest(:'tries'::double precision[]) AS x),
    'failures of one attempt back off 2 to 3 s, not all alike (jitter)');
SELECT is(runrow.fail_webhook_delivery(:'d2', :'k2', 'HTTP 500', 500, 3, 2), 'retrying', 'a first failure retries');
SELECT is(((pg_temp.delivery(:'batch')).next_attempt_at BETWEEN now() + interval '2 seconds' AND now() + interval '3 seconds',
           (pg_temp.delivery(:'batch')).last_error, (pg_temp.delivery(:'batch')).last_http_status,
           (pg_temp.delivery(:'batch')).claim_token)::text,
    ((true, 'HTTP 500', 500, NULL::uuid))::text, 'due after backoff * 2^0 (up to 50% more: jitter), lease cleared');
SELECT is(runrow.fail_webhook_delivery(:'d2', :'k2', 'again'), NULL, 'the same token again is fenced out');
SELECT is_empty($$SELECT * FROM runrow.claim_webhook_deliveries('w2', 100, 30, 3, 100)$$, 'not claimable during the backoff');
SELECT pg_temp.due_now(:'d2');
SELECT claim_token AS k2, attempt AS a2 FROM runrow.claim_webhook_deliveries('w2', 100, 30, 3, 100) \gset
SELECT is(:a2, 2, 'claimed again after the backoff as attempt 2');
SELECT is(runrow.fail_webhook_delivery(:'d2', :'k2', 'timed out', NULL, 3, 2), 'retrying', 'a timeout (no status) retries');
SELECT ok((pg_temp.delivery(:'batch')).next_attempt_at BETWEEN now() + interval '4 seconds' AND now() + interval '6 seconds',
    'due after backoff * 2^1 (up to 50% more)');
SELECT pg_temp.due_now(:'d2');
SELECT claim_token AS k2 FROM runrow.claim_webhook_deliveries('w2', 100, 30, 3, 100) \gset
SELECT is(runrow.fail_webhook_delivery(:'d2', :'k2', 'HTTP 503', 503, 3, 2), 'dead', 'the third failure of three dead-letters');
SELECT is(((pg_temp.delivery(:'batch')).state, (pg_temp.delivery(:'batch')).attempts)::text, '(dead,3)', 'dead after 3 attempts');
SELECT pg_temp.due_now(:'d2');
SELECT is_empty($$SELECT * FROM runrow.claim_webhook_deliveries('w2', 100, 30, 3, 100) WHERE run_id = $$ || quote_literal(:'batch'),
    'a dead letter is never claimed');
SELECT is((SELECT 21600 <= extract(epoch FROM next_attempt_at - now()) FROM (SELECT (pg_temp.delivery(:'batch')).*) AS x), false,
    'sanity: the backoff so far is below the cap');

-- A lease that lapses (the worker died mid-delivery) is taken over, same delivery id.
SELECT (SELECT delivery_id FROM c1 WHERE run_id = :'reaped') AS d3, (SELECT claim_token FROM c1 WHERE run_id = :'reaped') AS k3 \gset
SELECT pg_temp.lapse(:'d3');
CREATE TEMP TABLE c3 AS SELECT * FROM runrow.claim_webhook_deliveries('w2', 100, 30, 3, 100);
SELECT is((SELECT delivery_id FROM c3 WHERE run_id = :'reaped'), :'d3'::uuid, 'the lapsed delivery is claimed again, same id');
SELECT is((SELECT attempt FROM c3 WHERE run_id = :'reaped'), 2, 'as attempt 2: the lost one counts');
SELECT isnt((SELECT claim_token FROM c3 WHERE run_id = :'reaped'), :'k3'::uuid, 'with a new token');
SELECT is((pg_temp.delivery(:'reaped')).last_error, 'lease expired: worker w1 recorded no outcome of attempt 1',
    'the lost attempt is recorded');
SELECT pg_temp.outbox() AS before \gset
SELECT is(runrow.complete_webhook_delivery(:'d3', :'k3', 200), false, 'the old worker''s late success is fenced out');
SELECT is(runrow.fail_webhook_delivery(:'d3', :'k3', 'x'), NULL, 'so is its late failure');
SELECT is(pg_temp.outbox(), :'before', 'neither wrote anything');
SELECT ok(runrow.complete_webhook_delivery(:'d3', (SELECT claim_token FROM c3 WHERE run_id = :'reaped'), 200),
    'the new holder completes it');
-- Lapsed past the limit: dead-lettered by the claim instead of being handed out.
SELECT (SELECT delivery_id FROM c1 WHERE run_id = :'twice') AS d4 \gset
UPDATE runrow.webhook_delivery SET attempts = 3 WHERE id = :'d4';
SELECT pg_temp.lapse(:'d4');
SELECT is_empty($$SELECT * FROM runrow.claim_webhook_deliveries('w3', 100, 30, 3, 100) WHERE delivery_id = $$ || quote_literal(:'d4'),
    'a lapsed delivery that used its attempts is not handed out again');
SELECT is((pg_temp.delivery(:'twice')).state, 'dead', 'it is dead-lettered');

-- The views.
SELECT (SELECT delivery_id FROM c1 WHERE run_id = :'stopped') AS d5 \gset
SELECT pg_temp.lapse(:'d5');
SELECT is((SELECT count(*)::int FROM runrow.claim_webhook_deliveries('w4', 1, 30, 3, 100)), 1, 'max_deliveries caps the claim');
SELECT is((SELECT (pending, retrying, in_flight, dead_lettered >= 2, delivered_24h >= 2)::text FROM runrow.webhook_health),
    '(0,0,2,t,t)', 'webhook_health counts in-flight, dead-lettered and delivered deliveries');
SELECT set_eq($$SELECT run_id, state FROM runrow.webhook_outbox WHERE run_id IN (SELECT run_id FROM c1)$$,
    format($$VALUES (%L::uuid, 'dead'), (%L::uuid, 'dead'), (%L::uuid, 'pending'), (%L::uuid, 'pending')$$,
        :'batch', :'twice', :'stopped', :'cancelled'), 'webhook_outbox lists the undelivered ones');

-- A failure that will recur identically ends on its first attempt, whatever max_attempts says.
SELECT (SELECT delivery_id FROM c1 WHERE run_id = :'cancelled') AS d6, (SELECT claim_token FROM c1 WHERE run_id = :'cancelled') AS k6 \gset
SELECT pg_temp.outbox() AS before \gset
SELECT is(runrow.fail_webhook_delivery(:'d6', gen_random_uuid(), 'no request can be built', permanent => true), NULL,
    'a permanent failure is fenced like any other');
SELECT is(pg_temp.outbox(), :'before', 'and the fenced-out one wrote nothing');
SELECT is(runrow.fail_webhook_delivery(:'d6', :'k6', 'no request can be built', permanent => true), 'dead',
    'a permanent failure dead-letters at attempt 1 of the default 8');
SELECT is(((pg_temp.delivery(:'cancelled')).state, (pg_temp.delivery(:'cancelled')).attempts,
           (pg_temp.delivery(:'cancelled')).last_error)::text, '(dead,1,"no request can be built")',
    'dead after 1 attempt, with its reason');

-- A person re-arms a dead letter.
SELECT is(runrow.retry_webhook_delivery(:'d2'), true, 'retry_webhook_delivery re-arms a dead letter');
SELECT is(((pg_temp.delivery(:'batch')).state, (pg_temp.delivery(:'batch')).attempts,
           (pg_temp.delivery(:'batch')).next_attempt_at)::text, (('pending', 0, now()))::text, 'pending, attempts 0, due now');
SELECT pg_temp.outbox() AS before \gset
SELECT is(runrow.retry_webhook_delivery(:'d2'), false, 'a pending delivery is not retried');
SELECT is(runrow.retry_webhook_delivery(:'d1'), false, 'nor a delivered one');
SELECT is(runrow.retry_webhook_delivery(gen_random_uuid()), false, 'nor an unknown one');
SELECT is(pg_temp.outbox(), :'before', 'those wrote nothing');

-- Bad input: each argument named, nothing written.
SELECT pg_temp.outbox() AS before \gset
SELECT throws_ok($$SELECT * FROM runrow.claim_webhook_deliveries('w', 0)$$, '22023',
    'max_deliveries must be between 1 and 1000, got 0', 'max_deliveries 0');
SELECT throws_ok($$SELECT * FROM runrow.claim_webhook_deliveries('w', NULL)$$, '22004',
    'max_deliveries must not be NULL', 'max_deliveries NULL');
SELECT throws_ok($$SELECT * FROM runrow.claim_webhook_deliveries('w', 1, 0)$$, '22023',
    'lease_seconds must be between 1 and 3600, got 0', 'lease_seconds 0');
SELECT throws_ok($$SELECT * FROM runrow.claim_webhook_deliveries('w', 1, 30, 101)$$, '22023',
    'max_attempts must be between 1 and 100, got 101', 'max_attempts 101');
SELECT throws_ok(format('SELECT * FROM runrow.claim_webhook_deliveries(%L)', repeat('w', 201)), '22023',
    'worker_id must be NULL or at most 200 characters', 'worker_id too long');
SELECT throws_ok($$SELECT runrow.complete_webhook_delivery(NULL, gen_random_uuid(), 200)$$, '22004',
    'delivery_id must not be NULL', 'complete: delivery_id NULL');
SELECT throws_ok($$SELECT runrow.complete_webhook_delivery(gen_random_uuid(), NULL, 200)$$, '22004',
    'claim_token must not be NULL', 'complete: claim_token NULL');
SELECT throws_ok(format('SELECT runrow.complete_webhook_delivery(%L, %L, 500)', :'d5', gen_random_uuid()), '22023',
    'http_status must be between 200 and 299, got 500', 'complete: a 500 is no success');
SELECT throws_ok($$SELECT runrow.complete_webhook_delivery(gen_random_uuid(), gen_random_uuid(), NULL)$$, '22004',
    'http_status must not be NULL', 'complete: http_status NULL');
SELECT throws_ok($$SELECT runrow.fail_webhook_delivery(NULL, gen_random_uuid(), 'x')$$, '22004',
    'delivery_id must not be NULL', 'fail: delivery_id NULL');
SELECT throws_ok($$SELECT runrow.fail_webhook_delivery(gen_random_uuid(), NULL, 'x')$$, '22004',
    'claim_token must not be NULL', 'fail: claim_token NULL');
SELECT throws_ok($$SELECT runrow.fail_webhook_delivery(gen_random_uuid(), gen_random_uuid(), NULL)$$, '22004',
    'error must not be NULL', 'fail: error NULL');
SELECT throws_ok($$SELECT runrow.fail_webhook_delivery(gen_random_uuid(), gen_random_uuid(), '')$$, '22023',
    'error must be 1 to 10000 characters', 'fail: error empty');
SELECT throws_ok($$SELECT runrow.fail_webhook_delivery(gen_random_uuid(), gen_random_uuid(), 'x', 99)$$, '22023',
    'http_status must be NULL or between 100 and 599, got 99', 'fail: http_status 99');
SELECT throws_ok($$SELECT runrow.fail_webhook_delivery(gen_random_uuid(), gen_random_uuid(), 'x', NULL, 0)$$, '22023',
    'max_attempts must be between 1 and 100, got 0', 'fail: max_attempts 0');
SELECT throws_ok($$SELECT runrow.fail_webhook_delivery(gen_random_uuid(), gen_random_uuid(), 'x', NULL, 3, 0)$$, '22023',
    'backoff_seconds must be between 0.1 and 3600, got 0', 'fail: backoff_seconds 0');
SELECT throws_ok($$SELECT runrow.fail_webhook_delivery(gen_random_uuid(), gen_random_uuid(), 'x', NULL, 3, NULL)$$, '22004',
    'backoff_seconds must not be NULL', 'fail: backoff_seconds NULL');
SELECT throws_ok($$SELECT runrow.fail_webhook_delivery(gen_random_uuid(), gen_random_uuid(), 'x', permanent => NULL)$$, '22004',
    'permanent must not be NULL', 'fail: permanent NULL');
SELECT throws_ok($$SELECT runrow.retry_webhook_delivery(NULL)$$, '22004',
    'delivery_id must not be NULL', 'retry: delivery_id NULL');
SELECT is(pg_temp.outbox(), :'before', 'bad input wrote nothing');

-- Several endings in one statement (finish_runs): one delivery each, each with its own id and
-- its own run's body (the statement trigger writes them all in one INSERT, migration 0042).
SELECT pg_temp.drain_queue();
SELECT pg_temp.hooked() AS h1 \gset
SELECT pg_temp.hooked() AS h2 \gset
SELECT pg_temp.claim(:'h1') AS h1tok \gset
SELECT pg_temp.claim(:'h2') AS h2tok \gset
SELECT is((SELECT count(*) FILTER (WHERE f.finished) FROM runrow.finish_runs(jsonb_build_array(
        jsonb_build_object('run_id', :'h1', 'claim_token', :'h1tok', 'status', 'completed'),
        jsonb_build_object('run_id', :'h2', 'claim_token', :'h2tok', 'status', 'failed', 'error', 'no'))) AS f),
    2::bigint, 'two hooked runs ended by one finish_runs');
SELECT is((SELECT array_agg((w.payload ->> 'run_id') || ' ' || (w.payload ->> 'status') || ' ' || (w.id::text = w.payload ->> 'id')
                  ORDER BY w.payload ->> 'status')
           FROM runrow.webhook_delivery AS w WHERE w.run_id IN (:'h1', :'h2')),
    ARRAY[:'h1' || ' completed true', :'h2' || ' failed true'],
    'one delivery per run, each body naming its own run, status and delivery id');
SELECT is((SELECT count(DISTINCT w.id) FROM runrow.webhook_delivery AS w WHERE w.run_id IN (:'h1', :'h2')), 2::bigint,
    'the two deliveries have two ids');

SELECT * FROM finish();
ROLLBACK;
