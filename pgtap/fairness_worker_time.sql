-- Tenant fairness counts worker time (migration 0076): the claim stamps claimed_at by the
-- database clock, every ending of a claim (finish_run, finish_runs, finish_and_claim_runs,
-- release_run, defer_run, the reaper) charges the tenant the time it held the run beyond the
-- claim's own quantum (10 ms), over its weight, as a fairness_charge row; the next claim counts
-- pending charges in the tenant's clock and folds them in when it writes the clock. Fenced-out
-- and refused endings charge nothing; a single-tenant queue writes no clock and no charge.
-- Time passing is played by moving claimed_at back: the test is the table owner, and now() is
-- the transaction's.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(40);
SELECT pg_temp.drain_queue();
DELETE FROM runrow.fairness_charge;
DELETE FROM runrow.fairness_tenant;

CREATE FUNCTION pg_temp.run_of(tenant text) RETURNS uuid LANGUAGE sql AS $$
    SELECT run_id FROM runrow.enqueue_run(
        conversation_id => gen_random_uuid(), content => '"hello"', model => 'test-model',
        fairness_key => tenant, max_attempts => 3)
$$;
-- The running run of a tenant (the oldest), and its claim held `secs` seconds ago.
CREATE FUNCTION pg_temp.running_of(tenant text) RETURNS uuid LANGUAGE sql AS $$
    SELECT id FROM runrow.agent_run WHERE fairness_key = tenant AND status = 'running' ORDER BY enqueue_seq LIMIT 1
$$;
CREATE FUNCTION pg_temp.held(run uuid, secs numeric) RETURNS void LANGUAGE sql AS $$
    UPDATE runrow.agent_run SET claimed_at = now() - make_interval(secs => secs) WHERE id = run
$$;
-- A tenant's pending charges, rounded (floating point).
CREATE FUNCTION pg_temp.pending(tenant text) RETURNS numeric LANGUAGE sql AS $$
    SELECT round(coalesce(sum(units), 0)::numeric, 6) FROM runrow.fairness_charge WHERE fairness_key = tenant
$$;
CREATE FUNCTION pg_temp.charges() RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM runrow.fairness_charge
$$;
CREATE FUNCTION pg_temp.batch_by_tenant(n int) RETURNS TABLE (fairness_key text, runs int) LANGUAGE sql AS $$
    SELECT a.fairness_key, count(*)::int FROM runrow.claim_runs('pgtap', n) AS c
    JOIN runrow.agent_run AS a ON a.id = c.run_id GROUP BY 1 ORDER BY 1
$$;

-- The schema holds the pieces.
SELECT has_column('runrow', 'agent_run', 'claimed_at', 'agent_run.claimed_at exists');
SELECT has_column('runrow', 'fairness_tenant', 'vstart', 'fairness_tenant.vstart exists');
SELECT has_table('runrow', 'fairness_charge', 'fairness_charge exists');

-- Two tenants, b of weight 4; one claim takes one run of each and stamps both.
SELECT runrow.set_fairness_weight('b', 4);
SELECT pg_temp.run_of('a') FROM generate_series(1, 6);
SELECT pg_temp.run_of('b') FROM generate_series(1, 12);
SELECT results_eq('SELECT * FROM pg_temp.batch_by_tenant(2)', $$VALUES ('a', 1), ('b', 1)$$,
    'a claim of 2 takes one run of each tenant');
SELECT is((SELECT count(*)::int FROM runrow.agent_run WHERE status = 'running' AND claimed_at = now()), 2,
    'the claim stamps claimed_at with the database clock');
SELECT throws_ok($$UPDATE runrow.agent_run SET claimed_at = NULL WHERE status = 'running'$$, '23514', NULL,
    'a running run without claimed_at is refused (agent_run_claimed_at_when_running)');

-- Happy path: a's run held 1 s = 100 quanta, one charged at the claim: 99 more; b's run of
-- weight 4 held 1 s: 99 / 4.
SELECT pg_temp.running_of('a') AS a1, pg_temp.running_of('b') AS b1 \gset
SELECT pg_temp.held(:'a1', 1);
SELECT pg_temp.held(:'b1', 1);
SELECT ok(runrow.finish_run(:'a1', pg_temp.token(:'a1'), 'completed'), 'finish_run: happy path');
SELECT is(pg_temp.pending('a'), 99.000000, 'finish_run charges (1 s / 10 ms - 1) / weight');
SELECT ok(runrow.finish_run(:'b1', pg_temp.token(:'b1'), 'completed'), 'finish_run of b');
SELECT is(pg_temp.pending('b'), 24.750000, 'b of weight 4 is charged 99 / 4');

-- The next claims count the pending charges: a is at 1 + 99, b at 1/4 + 24.75, so b takes
-- the next 4 runs (each 1/4) and more, and a none.
SELECT results_eq('SELECT * FROM pg_temp.batch_by_tenant(8)', $$VALUES ('b', 8)$$,
    'the tenant charged less worker time takes the next claims');
SELECT is(pg_temp.pending('b'), 0.000000, 'the claim folded b''s charges into its clock');
SELECT is(pg_temp.pending('a'), 99.000000, 'a''s charges stay pending: a was not served');
SELECT is((SELECT round(vtime::numeric, 6) FROM runrow.fairness_tenant WHERE fairness_key = 'b'), 27.000000,
    'b''s clock: 1/4 + 24.75 + 8/4');
SELECT is((SELECT round(vstart::numeric, 6) FROM runrow.fairness_tenant WHERE fairness_key = 'b'), 26.750000,
    'b''s vstart: its clock when its latest run was claimed');
-- Counting claims, the batch alternated a and b by weight (a got 2 of the 8).

-- No banked credit, no burst: a tenant new to the level starts at the latest vstart (b's),
-- not one run behind a's clock, which its charges put far ahead; c and b then share.
SELECT pg_temp.run_of('c') FROM generate_series(1, 4);
SELECT results_eq('SELECT * FROM pg_temp.batch_by_tenant(2)', $$VALUES ('b', 1), ('c', 1)$$,
    'a new tenant starts level with the tenant served last, not with the one charged most');
SELECT cmp_ok((SELECT vtime FROM runrow.fairness_tenant WHERE fairness_key = 'c'), '<', 30::float8,
    'the new tenant''s clock starts near b''s, not at a''s 100');

-- Fenced-out: a finish or release with a stale token ends nothing and charges nothing.
SELECT pg_temp.running_of('b') AS b2 \gset
SELECT pg_temp.held(:'b2', 2);
SELECT is(pg_temp.charges(), 1::bigint, 'one charge pending (a''s)');
SELECT ok(NOT runrow.finish_run(:'b2', gen_random_uuid(), 'completed'), 'finish_run: fenced out');
SELECT is(runrow.release_run(:'b2', gen_random_uuid()), NULL, 'release_run: fenced out');
SELECT is(pg_temp.charges(), 1::bigint, 'a fenced-out ending charges nothing');

-- Bad input: a refused finish charges nothing either.
SELECT throws_ok(format($$SELECT runrow.finish_run(%L, %L, 'bogus')$$, :'b2', pg_temp.token(:'b2')), '22023', NULL,
    'finish_run: bad status is refused');
SELECT is(pg_temp.charges(), 1::bigint, 'a refused ending charges nothing');
SELECT throws_ok($$INSERT INTO runrow.fairness_charge (fairness_key, units) VALUES ('b', 0)$$, '23514', NULL,
    'a charge is positive');
SELECT throws_ok($$INSERT INTO runrow.fairness_charge (fairness_key, units) VALUES ('b', 'Infinity')$$, '23514',
    NULL, 'a charge is finite');

-- Every ending charges: release (requeue), defer, the reaper, the batch finishes.
SELECT is(pg_temp.pending('b'), 0.000000, 'b''s charges were folded by the last claim');
SELECT is(runrow.release_run(:'b2', pg_temp.token(:'b2')), 'requeued', 'release_run: happy path');
SELECT is(pg_temp.pending('b'), 49.750000, 'release_run charges the 2 s it held: 199 / 4');
SELECT pg_temp.running_of('b') AS b3 \gset
SELECT pg_temp.held(:'b3', 0.5);
SELECT is(runrow.defer_run(:'b3', pg_temp.token(:'b3'), '1 minute', 'later'), 'deferred', 'defer_run: happy path');
SELECT is(pg_temp.pending('b'), 62.000000, 'defer_run charges 49 / 4 more');
SELECT pg_temp.running_of('c') AS c1 \gset
SELECT pg_temp.held(:'c1', 0.2);
SELECT pg_temp.expire(:'c1');
SELECT is((SELECT outcome FROM runrow.reap_expired_runs(30, 10) WHERE run_id = :'c1'), 'requeued', 'the reaper reaps');
SELECT is(pg_temp.pending('c'), 19.000000, 'a reaped claim is charged too');
-- c (about 26 + 19) is now behind b (about 27 + 62) and a (1 + 99).
SELECT results_eq('SELECT * FROM pg_temp.batch_by_tenant(1)', $$VALUES ('c', 1)$$,
    'the claim weighs pending charges of every ending');
SELECT is(ARRAY[pg_temp.pending('a'), pg_temp.pending('b'), pg_temp.pending('c')], ARRAY[99.000000, 62.000000, 0.000000],
    'the served tenant''s charges are folded, the others'' stay pending');
SELECT pg_temp.running_of('b') AS b4, pg_temp.running_of('c') AS c2 \gset
SELECT pg_temp.held(:'b4', 0.11);
SELECT pg_temp.held(:'c2', 0.11);
SELECT is((SELECT count(*)::int FROM runrow.finish_runs(jsonb_build_array(
        jsonb_build_object('run_id', :'b4', 'claim_token', pg_temp.token(:'b4'), 'status', 'completed'),
        jsonb_build_object('run_id', :'c2', 'claim_token', pg_temp.token(:'c2'), 'status', 'completed')))
    WHERE finished), 2, 'finish_runs: happy path');
SELECT is(ARRAY[pg_temp.pending('b'), pg_temp.pending('c')], ARRAY[64.500000, 10.000000],
    'finish_runs charges each run''s tenant as finish_run would');
SELECT pg_temp.running_of('b') AS b5 \gset
SELECT pg_temp.held(:'b5', 0.11);
SELECT is((SELECT count(*)::int FROM runrow.finish_and_claim_runs(jsonb_build_array(
        jsonb_build_object('run_id', :'b5', 'claim_token', pg_temp.token(:'b5'), 'status', 'completed')),
        'pgtap', 1) WHERE finished), 1, 'finish_and_claim_runs: happy path');
SELECT is(pg_temp.pending('b'), 67.000000, 'finish_and_claim_runs charges as finish_run would');

-- A single-tenant queue writes no clock, so its endings charge nothing.
SELECT pg_temp.drain_queue();
DELETE FROM runrow.fairness_charge;
DELETE FROM runrow.fairness_tenant;
SELECT pg_temp.run_of('solo') AS s1 \gset
SELECT pg_temp.claim(:'s1');
SELECT pg_temp.held(:'s1', 5);
SELECT ok(runrow.finish_run(:'s1', pg_temp.token(:'s1'), 'completed'), 'a lone tenant''s run finishes');
SELECT is(pg_temp.charges() + (SELECT count(*) FROM runrow.fairness_tenant), 0::bigint,
    'a single-tenant queue writes no fairness row and no charge');

SELECT * FROM finish();
ROLLBACK;
