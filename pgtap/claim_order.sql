-- The claim's order and filters (SPEC.md "Fleet scheduling", migration 0018): priority high
-- first, then fairly across tenants (least recently served, weighted), then arrival; delayed
-- runs wait for their not_before; a concurrency key never has more runs running or waiting
-- than its limit. set_concurrency_limit and set_fairness_weight: happy path and bad input.
BEGIN;
\ir helpers/setup.psql
\ir helpers/row_versions.psql
\ir helpers/lifecycle.psql
SELECT plan(58);
SELECT pg_temp.drain_queue();

CREATE FUNCTION pg_temp.run_with(
    prio int DEFAULT 0, tenant text DEFAULT NULL, ckey text DEFAULT NULL, delay interval DEFAULT NULL,
    conv uuid DEFAULT gen_random_uuid()
) RETURNS uuid LANGUAGE sql AS $$
    SELECT run_id FROM runrow.enqueue_run(
        conversation_id => conv, content => '"hello"', model => 'test-model',
        priority => prio, fairness_key => tenant, concurrency_key => ckey, start_in => delay)
$$;
CREATE FUNCTION pg_temp.limits() RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(md5(string_agg(l::text, ',' ORDER BY l.concurrency_key)), '')
    FROM runrow.concurrency_limit AS l
$$;
CREATE FUNCTION pg_temp.weights() RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(md5(string_agg(f::text, ',' ORDER BY f.fairness_key)), '')
    FROM runrow.fairness_tenant AS f
$$;
-- One claim of a batch of up to n runs: how many of each tenant it took.
CREATE FUNCTION pg_temp.batch_by_tenant(n int) RETURNS TABLE (fairness_key text, runs int) LANGUAGE sql AS $$
    SELECT a.fairness_key, count(*)::int FROM runrow.claim_runs('pgtap', n) AS c
    JOIN runrow.agent_run AS a ON a.id = c.run_id GROUP BY 1 ORDER BY 1
$$;
-- Claims one at a time (as idle workers do) until nothing is left; the tenants in claim order.
CREATE FUNCTION pg_temp.claim_order(n int) RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE out text[] := '{}'; r record;
BEGIN
    FOR i IN 1 .. n LOOP
        SELECT c.run_id INTO r FROM runrow.claim_run('pgtap', 30) AS c;
        EXIT WHEN r.run_id IS NULL;
        out := out || (SELECT coalesce(a.fairness_key, '-') FROM runrow.agent_run AS a WHERE a.id = r.run_id);
    END LOOP;
    RETURN out;
END $$;

SELECT has_index('runrow', 'agent_run', 'agent_run_claimable', 'agent_run_claimable exists');
SELECT has_index('runrow', 'agent_run', 'agent_run_delayed', 'agent_run_delayed exists');
-- The cap is agent_run_after_update's, once per statement (0030), not a BEFORE row trigger's.
SELECT hasnt_trigger('runrow', 'agent_run', 'agent_run_concurrency_limit', 'no BEFORE row trigger for the cap');

-- Priority: a high-priority run enqueued behind older ones is claimed first; lower than the
-- default goes last.
SELECT pg_temp.run_with(prio => -5) AS low \gset
SELECT pg_temp.run_with() AS d1 \gset
SELECT pg_temp.run_with() AS d2 \gset
SELECT pg_temp.run_with(prio => 7) AS high \gset
SELECT is((SELECT run_id FROM runrow.claim_run('pgtap', 30)), :'high'::uuid, 'the high-priority run is claimed first');
SELECT is((SELECT run_id FROM runrow.claim_run('pgtap', 30)), :'d1'::uuid, 'then the default level in arrival order');
SELECT is((SELECT run_id FROM runrow.claim_run('pgtap', 30)), :'d2'::uuid, 'd2 after d1');
SELECT is((SELECT run_id FROM runrow.claim_run('pgtap', 30)), :'low'::uuid, 'the negative priority last');
SELECT pg_temp.drain_queue();

-- Fairness: tenant a enqueued 6 runs before b's 3; claims alternate instead of serving a first.
SELECT pg_temp.run_with(tenant => 'a') FROM generate_series(1, 6);
SELECT pg_temp.run_with(tenant => 'b') FROM generate_series(1, 3);
SELECT is(pg_temp.claim_order(20), '{a,b,a,b,a,b,a,a,a}'::text[], 'single claims alternate between tenants, then a alone');
SELECT pg_temp.drain_queue();
SELECT is((SELECT count(*)::int FROM runrow.fairness_tenant WHERE fairness_key IN ('a', 'b')), 2,
    'the claim keeps a clock per tenant it chose between');
-- One batch claim is fair too, and a tenant never seen starts level with the active ones
-- (no credit for having been idle): c and a alternate although a was served many times.
SELECT pg_temp.run_with(tenant => 'a') FROM generate_series(1, 4);
SELECT pg_temp.run_with(tenant => 'c') FROM generate_series(1, 4);
SELECT results_eq(
    'SELECT * FROM pg_temp.batch_by_tenant(4)',
    $$VALUES ('a', 2), ('c', 2)$$, 'a batch of 4 takes 2 of each tenant');
SELECT pg_temp.drain_queue();
-- The tenant is the user when no fairness_key is given.
SELECT run_id FROM runrow.enqueue_run(gen_random_uuid(), '"x"', 'm', user_id => 'u1') \gset
SELECT is((SELECT fairness_key FROM runrow.agent_run WHERE id = :'run_id'), 'u1', 'the default tenant is user_id');
SELECT pg_temp.drain_queue();

-- Weights: a tenant of weight 3 gets three claims for each of a weight-1 tenant's.
SELECT lives_ok($$SELECT runrow.set_fairness_weight('heavy', 3)$$, 'set_fairness_weight: happy path');
SELECT is((SELECT weight FROM runrow.fairness_tenant WHERE fairness_key = 'heavy'), 3::float8, 'the weight is stored');
SELECT pg_temp.run_with(tenant => 'heavy') FROM generate_series(1, 8);
SELECT pg_temp.run_with(tenant => 'light') FROM generate_series(1, 8);
SELECT results_eq(
    'SELECT * FROM pg_temp.batch_by_tenant(8)',
    $$VALUES ('heavy', 6), ('light', 2)$$, 'weight 3 against 1: 6 and 2 of 8');
SELECT pg_temp.drain_queue();
-- A weight under 1, claimed one run at a time (as idle workers claim): 1 of 5 claims, not 1 of 2.
-- The floor that stops idle tenants banking credit lifted the weight-1 tenant to within one
-- unit of the quarter's clock, which moves 4 per run (the fleet-limits audit).
SELECT lives_ok($$SELECT runrow.set_fairness_weight('quarter', 0.25)$$, 'a weight of 0.25');
SELECT pg_temp.run_with(tenant => 'quarter') FROM generate_series(1, 10);
SELECT pg_temp.run_with(tenant => 'whole') FROM generate_series(1, 10);
SELECT is((SELECT array_agg(t ORDER BY t) FROM unnest(pg_temp.claim_order(10)) AS t),
    '{quarter,quarter,whole,whole,whole,whole,whole,whole,whole,whole}'::text[],
    'weight 0.25 against 1, single claims: 2 and 8 of 10');
SELECT pg_temp.drain_queue();
-- A newcomer beside a tenant of a tiny weight starts one run of its own behind the others, not
-- one run of the tiny weight's (1,000 here): it took 500 claims in a row (the fairness audit).
SELECT pg_temp.run_with(tenant => 'x') FROM generate_series(1, 20);
SELECT pg_temp.run_with(tenant => 'y') FROM generate_series(1, 20);
SELECT pg_temp.claim_order(10);
SELECT runrow.set_fairness_weight('tiny', 0.001);
SELECT pg_temp.run_with(tenant => 'tiny') FROM generate_series(1, 3);
SELECT pg_temp.run_with(tenant => 'newcomer') FROM generate_series(1, 20);
SELECT is((SELECT array_agg(t ORDER BY t) FROM unnest(pg_temp.claim_order(10)) AS t),
    '{newcomer,newcomer,newcomer,tiny,x,x,x,y,y,y}'::text[],
    'a newcomer beside a weight of 0.001 shares with the served tenants: 3 of 10, as each of them');
SELECT pg_temp.drain_queue();
SELECT lives_ok($$SELECT runrow.set_fairness_weight(NULL, 2)$$, 'the anonymous tenant can be weighted (NULL)');
SELECT is((SELECT weight FROM runrow.fairness_tenant WHERE fairness_key = ''), 2::float8, 'stored under ''''');
SELECT lives_ok($$SELECT runrow.set_fairness_weight('heavy', NULL)$$, 'NULL weight resets to 1');
SELECT is((SELECT weight FROM runrow.fairness_tenant WHERE fairness_key = 'heavy'), 1::float8, 'back to 1');
SELECT pg_temp.weights() AS w_before \gset
SELECT throws_ok($$SELECT runrow.set_fairness_weight('t', 0)$$, '22023', NULL, 'weight 0 is refused');
SELECT throws_ok($$SELECT runrow.set_fairness_weight('t', 1001)$$, '22023', NULL, 'weight over 1000 is refused');
SELECT throws_ok($$SELECT runrow.set_fairness_weight('t', 'NaN')$$, '22023', NULL, 'NaN is refused');
SELECT throws_ok($$SELECT runrow.set_fairness_weight('t', 1e-320)$$, '22023',
    'weight must be NULL or from 0.001 to 1000, got 1e-320', 'a denormal weight is refused, naming the range');
SELECT throws_ok($$SELECT runrow.set_fairness_weight('t', 0.0009)$$, '22023', NULL, 'a weight under 0.001 is refused');
SELECT throws_ok($$INSERT INTO runrow.fairness_tenant (fairness_key, weight) VALUES ('t', 1e-320)$$, '23514', NULL,
    'the table refuses a weight under 0.001 too');
SELECT throws_ok($$SELECT runrow.set_fairness_weight('', 1)$$, '22023', 'fairness_key must be NULL or 1 to 200 characters',
    'an empty fairness_key is refused, naming it');
SELECT is(pg_temp.weights(), :'w_before', 'bad input writes nothing');
-- The smallest weight still claims, and does not stop the claim for the other tenants: a weight
-- of 1e-320 made the claim's 1 / weight overflow, and every claim raised (migration 0064).
SELECT lives_ok($$SELECT runrow.set_fairness_weight('tiny', 0.001)$$, 'weight 0.001 is accepted');
SELECT pg_temp.run_with(tenant => 'tiny') FROM generate_series(1, 3);
SELECT pg_temp.run_with(tenant => 'light') FROM generate_series(1, 3);
SELECT results_eq(
    'SELECT * FROM pg_temp.batch_by_tenant(4)',
    $$VALUES ('light', 3), ('tiny', 1)$$, 'weight 0.001 against 1: the claim still weighs both (1 and 3 of 4)');
SELECT pg_temp.drain_queue();

-- Delays: a run not due yet is not claimed, and does not hold back runs behind it.
SELECT pg_temp.run_with(delay => '1 hour') AS later \gset
SELECT pg_temp.run_with() AS now_run \gset
SELECT is((SELECT run_id FROM runrow.claim_run('pgtap', 30)), :'now_run'::uuid, 'the due run is claimed, the delayed one skipped');
SELECT pg_temp.written() AS before_empty \gset
SELECT is_empty($$SELECT * FROM runrow.claim_runs('pgtap', 10)$$, 'nothing claimable before not_before');
SELECT is(pg_temp.written(), :'before_empty', 'and the empty claim writes nothing');
-- A delayed turn keeps the turns after it in its conversation waiting (turn order).
SELECT conversation_id AS later_conv FROM runrow.agent_run WHERE id = :'later' \gset
SELECT pg_temp.run_with(conv => :'later_conv') AS after_later \gset
SELECT is_empty($$SELECT * FROM runrow.claim_runs('pgtap', 10)$$, 'a turn behind a delayed turn waits too');
-- Time passes (the transaction's clock stands still, so move not_before instead).
UPDATE runrow.agent_run SET not_before = now() - interval '1 second' WHERE id = :'later';
SELECT is((SELECT run_id FROM runrow.claim_runs('pgtap', 10)), :'later'::uuid, 'once due, the delayed run is claimed');
SELECT is((SELECT not_before FROM runrow.agent_run WHERE id = :'later'), NULL, 'and its not_before is cleared');
SELECT ok(runrow.finish_run(:'later', pg_temp.token(:'later'), 'completed'), 'it finishes');
SELECT is((SELECT run_id FROM runrow.claim_runs('pgtap', 10)), :'after_later'::uuid, 'then the turn behind it');
-- release_run retry_in: requeued, not claimable until the backoff passed.
SELECT runrow.release_run(:'after_later', pg_temp.token(:'after_later'), 'backoff', interval '1 minute');
SELECT pg_temp.drain_queue();

-- Concurrency caps: never more runs of a key running or waiting than its limit, and a capped
-- key does not make the batch claim nothing.
SELECT lives_ok($$SELECT runrow.set_concurrency_limit('tools', 2)$$, 'set_concurrency_limit: happy path');
SELECT pg_temp.run_with(ckey => 'tools') FROM generate_series(1, 4);
SELECT pg_temp.run_with() AS free_run \gset
SELECT is((SELECT count(*)::int FROM runrow.claim_runs('pgtap', 10)), 3, 'a batch takes 2 capped runs and the free one');
SELECT is((SELECT count(*)::int FROM runrow.agent_run WHERE concurrency_key = 'tools' AND status = 'running'), 2,
    'the key is at its limit');
SELECT is_empty($$SELECT * FROM runrow.claim_runs('pgtap', 10)$$, 'no claim takes more of it');
SELECT id AS t1 FROM runrow.agent_run WHERE concurrency_key = 'tools' AND status = 'running' ORDER BY enqueue_seq LIMIT 1 \gset
SELECT ok(runrow.finish_run(:'t1', pg_temp.token(:'t1'), 'completed'), 'one of them finishes');
SELECT is((SELECT count(*)::int FROM runrow.claim_runs('pgtap', 10)), 1, 'exactly one more is claimed');
-- The trigger is the guarantee, not the claim's filter.
SELECT id AS t4 FROM runrow.agent_run WHERE concurrency_key = 'tools' AND status = 'queued' \gset
SELECT throws_ok(format($$UPDATE runrow.agent_run SET status = 'running', claim_token = gen_random_uuid(),
    worker_id = 'x', claim_expires_at = now() + interval '1 minute', attempt = 1 WHERE id = %L$$, :'t4'),
    '23514', NULL, 'starting a run of a key at its limit by any other way raises check_violation');
SELECT lives_ok($$SELECT runrow.set_concurrency_limit('tools', 3)$$, 'raising the limit');
SELECT is((SELECT run_id FROM runrow.claim_runs('pgtap', 10)), :'t4'::uuid, 'lets the last run start');
SELECT lives_ok($$SELECT runrow.set_concurrency_limit('paused', 0)$$, 'a limit of 0');
SELECT pg_temp.run_with(ckey => 'paused') AS p1 \gset
SELECT is_empty($$SELECT * FROM runrow.claim_runs('pgtap', 10)$$, 'pauses the key');
SELECT lives_ok($$SELECT runrow.set_concurrency_limit('paused', NULL)$$, 'NULL removes the limit');
SELECT is((SELECT run_id FROM runrow.claim_runs('pgtap', 10)), :'p1'::uuid, 'and the run is claimed');
SELECT pg_temp.limits() AS l_before \gset
SELECT throws_ok($$SELECT runrow.set_concurrency_limit(NULL, 1)$$, '22004', 'concurrency_key must not be NULL',
    'a NULL concurrency_key is refused, naming it');
SELECT throws_ok($$SELECT runrow.set_concurrency_limit('', 1)$$, '22023', 'concurrency_key must be NULL or 1 to 200 characters',
    'an empty key is refused');
SELECT throws_ok(format($$SELECT runrow.set_concurrency_limit(%L, 1)$$, repeat('k', 201)), '22023', NULL, 'a long key is refused');
SELECT throws_ok($$SELECT runrow.set_concurrency_limit('tools', -1)$$, '22023', 'max_running must be between 0 and 100000, got -1',
    'a negative limit is refused, naming max_running');
SELECT throws_ok($$SELECT runrow.set_concurrency_limit('no-such-key', NULL)$$, 'P0002',
    'concurrency_key "no-such-key" has no concurrency limit to remove',
    'removing a limit that is not there says so, as the other set_* functions do');
SELECT is(pg_temp.limits(), :'l_before', 'bad input writes nothing');

SELECT * FROM finish();
ROLLBACK;
