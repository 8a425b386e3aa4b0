-- Fleet limits (issue 13): set_rate_limit, acquire_model_call, report_rate_limited,
-- set_tenant_budget, set_model_price, and append_step's settlement of usage. Happy path,
-- fenced out, bad input (nothing written). now() is fixed inside this transaction, so the
-- refill is tested by moving refilled_at into the past.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(93);
SELECT pg_temp.drain_queue();

CREATE FUNCTION pg_temp.limits_fingerprint() RETURNS text LANGUAGE sql AS $$
    SELECT concat_ws('|', pg_temp.fingerprint(),
        (SELECT md5(coalesce(string_agg(to_jsonb(l)::text, '' ORDER BY l.rate_limit_key), '')) FROM runrow.rate_limit AS l),
        (SELECT md5(coalesce(string_agg(to_jsonb(p)::text, '' ORDER BY p.model), '')) FROM runrow.model_price AS p),
        (SELECT md5(coalesce(string_agg(to_jsonb(b)::text, '' ORDER BY b.fairness_key), '')) FROM runrow.tenant_budget AS b),
        (SELECT md5(coalesce(string_agg(to_jsonb(s)::text, '' ORDER BY s.fairness_key, s.hour, s.model), ''))
         FROM runrow.spend_hour AS s))
$$;
-- A running run of its own conversation with fleet arguments.
CREATE FUNCTION pg_temp.fleet_run(key text DEFAULT NULL, tokens bigint DEFAULT NULL, cost numeric DEFAULT NULL,
    tenant text DEFAULT NULL, model text DEFAULT 'test-model') RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE run uuid;
BEGIN
    SELECT e.run_id INTO run FROM runrow.enqueue_run(
        conversation_id => gen_random_uuid(), content => '"hi"', model => model, user_id => tenant,
        rate_limit_key => key, token_budget => tokens, cost_budget => cost) AS e;
    PERFORM pg_temp.claim(run);
    RETURN run;
END $$;
CREATE FUNCTION pg_temp.acquire(run uuid, estimate int DEFAULT 100) RETURNS text LANGUAGE sql AS $$
    SELECT (a.granted, a.wait_seconds, a.reason)::text
    FROM runrow.acquire_model_call(run, pg_temp.token(run), estimate) AS a
$$;
CREATE FUNCTION pg_temp.step(run uuid, usage jsonb, txt text DEFAULT 'so far') RETURNS int LANGUAGE sql AS $$
    SELECT runrow.append_step(run, pg_temp.token(run), 'model_turn',
        json_build_array(json_build_object('type', 'text', 'text', txt)), NULL, usage, 'end_turn')
$$;

SELECT has_function('runrow', 'acquire_model_call', ARRAY['uuid', 'uuid', 'integer'], 'acquire_model_call exists');

-- No limit, no block: granted, no limit written; the run keeps the call's reservation (what a
-- reap charges if its holder dies before settling it: pgtap/model_call_reserved.sql).
SELECT pg_temp.fleet_run('free-key') AS free \gset
SELECT regexp_replace(pg_temp.limits_fingerprint(), '^[^|]*', '') AS before \gset
SELECT is(pg_temp.acquire(:'free'), '(t,0,)', 'a key without a row is not limited');
SELECT is(regexp_replace(pg_temp.limits_fingerprint(), '^[^|]*', ''), :'before',
    'a grant on an unlimited key writes no limit, price, budget or spend');
SELECT is((SELECT model_call_reserved FROM runrow.agent_run WHERE id = :'free'),
    '{"input_tokens": 100, "output_tokens": 4096}'::jsonb, 'only the call''s reservation, on the run');

-- set_rate_limit: a new key starts full.
SELECT lives_ok($$SELECT runrow.set_rate_limit('k1', 2, 1000, 500)$$, 'set_rate_limit creates a key');
SELECT is((SELECT (requests_left, input_tokens_left, output_tokens_left)::text FROM runrow.rate_limit
    WHERE rate_limit_key = 'k1'), '(2,1000,500)', 'a new key starts with full buckets');
SELECT is((SELECT requests_per_minute FROM runrow.rate_limits WHERE rate_limit_key = 'k1'), 2,
    'the rate_limits view shows it');

SELECT pg_temp.fleet_run('k1') AS r1 \gset
SELECT is(pg_temp.acquire(:'r1', 300), '(t,0,)', 'first request granted');
SELECT is((SELECT (requests_left, input_tokens_left)::text FROM runrow.rate_limit WHERE rate_limit_key = 'k1'),
    '(1,700)', 'the grant took one request and the estimate');
SELECT is((SELECT granted_input_tokens FROM runrow.agent_run WHERE id = :'r1'), 300, 'the grant is remembered');
SELECT is(pg_temp.acquire(:'r1', 800), '(f,6.000,rate_limited)',
    'too few input tokens left: wait until the bucket holds the estimate');
SELECT is(pg_temp.acquire(:'r1', 100), '(t,0,)', 'a smaller estimate fits');
SELECT is(pg_temp.acquire(:'r1', 0), '(f,30.000,rate_limited)', 'no request left: wait for one (60 s / 2 per minute)');
SELECT is((SELECT requests_left FROM runrow.rate_limit WHERE rate_limit_key = 'k1'), 0::numeric,
    'refusals never overdraw the requests bucket');

-- Refill with the database clock: 15 s later, half a request; 30 s, a whole one.
UPDATE runrow.rate_limit SET refilled_at = now() - interval '15 seconds' WHERE rate_limit_key = 'k1';
SELECT is(pg_temp.acquire(:'r1', 0), '(f,15.000,rate_limited)', 'after 15 s half a request has refilled');
UPDATE runrow.rate_limit SET refilled_at = now() - interval '15 seconds' WHERE rate_limit_key = 'k1';
SELECT is(pg_temp.acquire(:'r1', 0), '(t,0,)', 'after 30 s in all a request is granted');
UPDATE runrow.rate_limit SET refilled_at = now() - interval '1 hour' WHERE rate_limit_key = 'k1';
SELECT is(pg_temp.acquire(:'r1', 50000), '(t,0,)', 'an estimate over a minute''s worth goes once the bucket is full');
SELECT is((SELECT (requests_left, input_tokens_left)::text FROM runrow.rate_limit WHERE rate_limit_key = 'k1'),
    '(1,0)', 'the bucket refilled to at most a minute''s worth, and the grant took that minute''s worth');
SELECT is((SELECT granted_input_tokens FROM runrow.agent_run WHERE id = :'r1'), 1000,
    'the grant remembers what it took');
-- A grant that never settles (the request failed; no usage comes) holds the key back a minute
-- at most: the whole estimate put the key 49,000 tokens in debt, and every run waited 49 minutes.
SELECT pg_temp.fleet_run('k1') AS r_next \gset
UPDATE runrow.rate_limit SET refilled_at = now() - interval '1 minute' WHERE rate_limit_key = 'k1';
SELECT is(pg_temp.acquire(:'r_next', 500), '(t,0,)', 'a minute later the next run of the key is granted');
SELECT pg_temp.step(:'r_next', '{"input_tokens": 50000, "output_tokens": 0}');
SELECT is((SELECT input_tokens_left FROM runrow.rate_limit WHERE rate_limit_key = 'k1'), -49000::numeric,
    'a big call that does settle is charged its real input: the rest of it lands then');

-- Settlement: the real uncached input replaces the estimate, output is charged.
UPDATE runrow.rate_limit SET input_tokens_left = 0, output_tokens_left = 500, refilled_at = now()
WHERE rate_limit_key = 'k1';
UPDATE runrow.agent_run SET granted_input_tokens = 300 WHERE id = :'r1';
SELECT pg_temp.step(:'r1', '{"input_tokens": 100, "cache_creation_input_tokens": 50,
    "cache_read_input_tokens": 1000, "output_tokens": 520}');
SELECT is((SELECT (input_tokens_left, output_tokens_left)::text FROM runrow.rate_limit WHERE rate_limit_key = 'k1'),
    '(150,-20)', 'settled: estimate 300 back, 150 uncached input taken (cache reads free), 520 output');
SELECT is((SELECT (spent_tokens, granted_input_tokens)::text FROM runrow.agent_run WHERE id = :'r1'),
    '(1670,)', 'the run spent input + cache writes + cache reads + output; the grant is cleared');
SELECT is(pg_temp.acquire(:'r1', 0), '(f,2.520,rate_limited)', 'output in debt: wait until it is back above 0');

-- set_rate_limit changes keep the levels, capped.
SELECT runrow.set_rate_limit('k1', 1, 100, NULL);
SELECT is((SELECT (requests_per_minute, requests_left, input_tokens_left, output_tokens_left)::text
    FROM runrow.rate_limit WHERE rate_limit_key = 'k1'), '(1,1,100,0)',
    'a changed key keeps its levels capped to the new limits; an unlimited dimension holds 0');

-- report_rate_limited: a block stops every grant for the key, and empties the bucket.
SELECT pg_temp.fleet_run('k1') AS r2 \gset
SELECT lives_ok(format('SELECT runrow.report_rate_limited(%L, %L, 30)', :'r1', pg_temp.token(:'r1')),
    'report_rate_limited blocks the key');
SELECT is(pg_temp.acquire(:'r2', 0), '(f,30.000,blocked)', 'another run of the key is told the block''s time left');
SELECT is((SELECT (requests_left, blocks_reported, blocked_by_run)::text FROM runrow.rate_limit
    WHERE rate_limit_key = 'k1'), format('(0,1,%s)', :'r1'), 'the requests bucket is emptied; who reported is kept');
SELECT is((SELECT count(*)::int FROM runrow.rate_limit_blocks WHERE rate_limit_key = 'k1'), 1,
    'rate_limit_blocks shows the block');
SELECT runrow.report_rate_limited(:'r2', pg_temp.token(:'r2'), 5);
SELECT is((SELECT (blocked_until = now() + interval '30 seconds', blocks_reported)::text FROM runrow.rate_limit
    WHERE rate_limit_key = 'k1'), '(t,2)', 'a shorter block never shortens the one in force');
UPDATE runrow.rate_limit SET blocked_until = now() - interval '1 second', refilled_at = now() - interval '1 second'
WHERE rate_limit_key = 'k1';
SELECT is(pg_temp.acquire(:'r2', 0), '(f,59.000,rate_limited)', 'after the block the bucket refills from empty');
-- A key without limits gets a block-only row.
SELECT pg_temp.fleet_run('fresh') AS r3 \gset
SELECT runrow.report_rate_limited(:'r3', pg_temp.token(:'r3'), 2.5);
SELECT is(pg_temp.acquire(:'r3', 0), '(f,2.500,blocked)', 'a key without limits can still be blocked');

-- Fenced out: a stale token gets nothing and writes nothing.
SELECT pg_temp.limits_fingerprint() AS before \gset
SELECT is_empty(format('SELECT * FROM runrow.acquire_model_call(%L, gen_random_uuid(), 10)', :'free'),
    'acquire_model_call with a stale token: no row');
SELECT lives_ok(format('SELECT runrow.report_rate_limited(%L, gen_random_uuid(), 10)', :'free'),
    'report_rate_limited with a stale token is not an error');
SELECT is(pg_temp.limits_fingerprint(), :'before', 'fenced-out calls wrote nothing');

-- Bad input: standard SQLSTATEs naming the argument, nothing written.
SELECT throws_ok($$SELECT runrow.set_rate_limit('k1', -1, NULL, NULL)$$, '22023',
    'requests_per_minute must be NULL or a finite number more than 0, got -1', 'a negative rate');
SELECT throws_ok($$SELECT runrow.set_rate_limit('k1', 10, 0, NULL)$$, '22023',
    'input_tokens_per_minute must be NULL or a finite number more than 0, got 0', 'a zero rate');
SELECT throws_ok($$SELECT runrow.set_rate_limit('k1', 10, 10, -5)$$, '22023',
    'output_tokens_per_minute must be NULL or a finite number more than 0, got -5', 'a negative output rate');
SELECT throws_ok($$SELECT runrow.set_rate_limit(NULL, 10, 10, 10)$$, '22004', 'rate_limit_key must not be NULL',
    'a NULL key');
SELECT throws_ok($$SELECT runrow.set_rate_limit('', 10, 10, 10)$$, '22023',
    'rate_limit_key must be NULL or 1 to 200 characters', 'an empty key');
SELECT throws_ok($$SELECT runrow.set_rate_limit('no-such-key', NULL, NULL, NULL)$$, 'P0002',
    'rate_limit_key "no-such-key" has no rate limit to remove', 'removing an unknown key');
SELECT throws_ok(format('SELECT runrow.report_rate_limited(%L, %L, 0)', :'r2', pg_temp.token(:'r2')), '22023',
    'retry_after_seconds must be more than 0 and at most 86400, got 0', 'a zero retry-after');
SELECT throws_ok(format('SELECT runrow.report_rate_limited(%L, %L, -3)', :'r2', pg_temp.token(:'r2')), '22023',
    'retry_after_seconds must be more than 0 and at most 86400, got -3', 'a negative retry-after');
SELECT throws_ok(format('SELECT runrow.report_rate_limited(%L, NULL, 3)', :'r2'), '22004',
    'claim_token must not be NULL', 'a NULL claim_token');
SELECT throws_ok(format('SELECT * FROM runrow.acquire_model_call(%L, %L, -1)', :'r2', pg_temp.token(:'r2')), '22023',
    'input_tokens_estimate must be between 0 and 100000000, got -1', 'a negative estimate');
SELECT throws_ok(format('SELECT * FROM runrow.acquire_model_call(%L, %L, NULL)', :'r2', pg_temp.token(:'r2')),
    '22004', 'input_tokens_estimate must not be NULL', 'a NULL estimate');
SELECT throws_ok($$SELECT runrow.set_tenant_budget('t', -1, NULL)$$, '22023',
    'tokens_per_day must be NULL or a finite number more than 0, got -1', 'a negative tenant budget');
SELECT throws_ok($$SELECT runrow.set_tenant_budget('nobody', NULL, NULL)$$, 'P0002',
    'fairness_key "nobody" has no tenant budget to remove', 'removing an unknown tenant budget');
SELECT throws_ok($$SELECT runrow.set_model_price('m', 1, -2, 0, 0)$$, '22023',
    'output_per_mtok must be a finite number, 0 or more (USD per million tokens), got -2', 'a negative price');
-- NaN sorts above every number in PostgreSQL, so it passed >= 0 and > 0; a NaN price made the
-- tenant's rolling spend NaN and failed all its runs for a day (migration 0065).
SELECT throws_ok($$SELECT runrow.set_model_price('m', 'NaN', 2, 0, 0)$$, '22023',
    'input_per_mtok must be a finite number, 0 or more (USD per million tokens), got NaN', 'a NaN price');
SELECT throws_ok($$SELECT runrow.set_model_price('m', 1, 2, 0, 'Infinity')$$, '22023',
    'cache_read_per_mtok must be a finite number, 0 or more (USD per million tokens), got Infinity',
    'an infinite price');
SELECT throws_ok($$SELECT runrow.set_tenant_budget('t', NULL, 'NaN')$$, '22023',
    'cost_per_day must be NULL or a finite number more than 0, got NaN', 'a NaN cost budget');
SELECT throws_ok($$SELECT runrow.set_tenant_budget('t', NULL, 'Infinity')$$, '22023',
    'cost_per_day must be NULL or a finite number more than 0, got Infinity', 'an infinite cost budget');
SELECT throws_ok($$SELECT runrow.set_model_price('m', 1, 2, NULL, 0)$$, '22004',
    'cache_write_per_mtok must not be NULL (all four prices NULL removes the model''s price)', 'one price NULL');
SELECT throws_ok($$SELECT runrow.set_model_price('no-such-model', NULL, NULL, NULL, NULL)$$, 'P0002',
    'model "no-such-model" has no price to remove', 'removing an unknown price');
SELECT is(pg_temp.limits_fingerprint(), :'before', 'bad input wrote nothing');
-- The tables hold the rule themselves (a write that bypasses the functions).
SELECT throws_ok($$INSERT INTO runrow.model_price (model, input_per_mtok, output_per_mtok, cache_write_per_mtok,
    cache_read_per_mtok, cache_write_1h_per_mtok) VALUES ('m-nan', 'NaN', 1, 1, 1, 2)$$, '23514', NULL,
    'model_price refuses a NaN price');
SELECT throws_ok($$INSERT INTO runrow.model_price (model, input_per_mtok, output_per_mtok, cache_write_per_mtok,
    cache_read_per_mtok, cache_write_1h_per_mtok) VALUES ('m-inf', 1, 1, 1, 1, 'Infinity')$$, '23514', NULL,
    'model_price refuses an infinite 1-hour price');
SELECT throws_ok($$INSERT INTO runrow.tenant_budget (fairness_key, cost_per_day) VALUES ('t-inf', 'Infinity')$$,
    '23514', NULL, 'tenant_budget refuses an infinite cost budget');
SELECT pg_temp.fleet_run(cost => 1) AS nan_budget \gset
SELECT throws_ok(format($$UPDATE runrow.agent_run SET cost_budget = 'NaN' WHERE id = %L$$, :'nan_budget'), '23514',
    'new row for relation "agent_run" violates check constraint "agent_run_cost_budget_positive"',
    'agent_run refuses a NaN cost_budget, whoever writes it');

-- A limit set on a key while a 429 blocks it starts with an empty request bucket, as the
-- block left a limited one: it started full, and burst into the wall at the block's end.
SELECT pg_temp.fleet_run('k-unlimited') AS unl \gset
SELECT runrow.report_rate_limited(:'unl', pg_temp.token(:'unl'), 60);
SELECT runrow.set_rate_limit('k-unlimited', 10, NULL, NULL);
SELECT is((SELECT (requests_left, refilled_at = blocked_until)::text FROM runrow.rate_limit
           WHERE rate_limit_key = 'k-unlimited'), '(0,t)',
    'a limit set during a block starts empty and refills from the block''s end');

-- Removing a key lifts its limits and block.
SELECT runrow.set_rate_limit('fresh', NULL, NULL, NULL);
SELECT is(pg_temp.acquire(:'r3', 0), '(t,0,)', 'a removed key is not limited any more');
-- And the runs of the key that a claim held back for the block (their not_before set to its
-- end, an hour away) are claimable at once; a run's own backoff is kept.
SELECT runrow.set_rate_limit('k-held', 10, NULL, NULL);
SELECT pg_temp.fleet_run('k-held') AS holder \gset
SELECT runrow.report_rate_limited(:'holder', pg_temp.token(:'holder'), 3600);
SELECT e.run_id AS held FROM runrow.enqueue_run(gen_random_uuid(), '"hi"', 'test-model', rate_limit_key => 'k-held') AS e \gset
SELECT e.run_id AS backed_off
FROM runrow.enqueue_run(gen_random_uuid(), '"hi"', 'test-model', rate_limit_key => 'k-held', start_in => '2 hours') AS e \gset
SELECT is_empty($$SELECT * FROM runrow.claim_runs('pgtap', 10)$$, 'a blocked key''s run is not claimed');
SELECT is((SELECT not_before FROM runrow.agent_run WHERE id = :'held'),
    (SELECT blocked_until FROM runrow.rate_limit WHERE rate_limit_key = 'k-held'),
    'the claim held it back until the block''s end');
SELECT runrow.set_rate_limit('k-held', NULL, NULL, NULL);
SELECT is((SELECT run_id FROM runrow.claim_runs('pgtap', 10)), :'held'::uuid,
    'once the key is removed, the held-back run is claimed at once (it stayed queued for the hour)');
SELECT isnt((SELECT not_before FROM runrow.agent_run WHERE id = :'backed_off'), NULL,
    'a run of the key delayed for its own reason keeps its delay');
SELECT ok(runrow.finish_run(:'held', pg_temp.token(:'held'), 'completed'), 'the released run finishes');

-- Run token budget: the step that crosses it is kept; the next request ends the run.
SELECT pg_temp.fleet_run(tokens => 2000) AS b1 \gset
SELECT is(pg_temp.acquire(:'b1'), '(t,0,)', 'under budget: granted');
SELECT pg_temp.step(:'b1', '{"input_tokens": 1500, "output_tokens": 600}', 'partial answer');
SELECT is((SELECT (status, budget_exhausted)::text FROM runrow.agent_run WHERE id = :'b1'),
    '(running,"budget_exhausted: the run used 2100 tokens of its token_budget of 2000")',
    'the crossing step is kept and the crossing decided in its transaction');
SELECT is(pg_temp.acquire(:'b1'), '(f,,budget_exhausted)', 'the next request is refused');
SELECT is((SELECT (status, error, result ->> 'text', claim_token IS NULL)::text FROM runrow.agent_run WHERE id = :'b1'),
    '(failed,"budget_exhausted: the run used 2100 tokens of its token_budget of 2000","partial answer",t)',
    'the run ended failed budget_exhausted, its result keeps the text so far');
SELECT is((pg_temp.journal(:'b1'))[array_length(pg_temp.journal(:'b1'), 1) - 1:],
    ARRAY['budget_exhausted', 'complete'], 'the journal says so');

-- Cost budget with prices: cache reads at their price.
SELECT lives_ok($$SELECT runrow.set_model_price('priced', 3, 15, 3.75, 0.3)$$, 'set_model_price');
SELECT pg_temp.fleet_run(cost => 0.01, model => 'priced') AS c1 \gset
SELECT is(pg_temp.acquire(:'c1'), '(t,0,)', 'priced model, under its cost budget: granted');
SELECT pg_temp.step(:'c1', '{"input_tokens": 1000, "output_tokens": 200, "cache_read_input_tokens": 10000}');
SELECT is((SELECT spent_cost FROM runrow.agent_run WHERE id = :'c1'), 0.009::numeric,
    '1000 in x 3 + 200 out x 15 + 10000 cache reads x 0.3 per million = 0.009 USD');
SELECT pg_temp.step(:'c1', '{"input_tokens": 1000}');
SELECT is(pg_temp.acquire(:'c1'), '(f,,budget_exhausted)', 'the cost budget crossed: refused');
-- 1-hour cache writes at their own price: by default twice input (the API's rule), not the
-- 5-minute rate (the money audit: 37 % low).
SELECT is((SELECT cache_write_1h_per_mtok FROM runrow.model_prices WHERE model = 'priced'), 6::numeric,
    'the 1-hour cache write price defaults to 2 x input');
SELECT pg_temp.fleet_run(cost => 1, model => 'priced') AS h1 \gset
SELECT pg_temp.step(:'h1', '{"cache_creation_input_tokens": 1000,
    "cache_creation": {"ephemeral_1h_input_tokens": 600, "ephemeral_5m_input_tokens": 400}}');
SELECT is((SELECT spent_cost FROM runrow.agent_run WHERE id = :'h1'), 0.0051::numeric,
    '600 one-hour writes x 6 + 400 five-minute writes x 3.75 per million = 0.0051 USD');
SELECT lives_ok($$SELECT runrow.set_model_price('priced-1h', 3, 15, 3.75, 0.3, 5)$$, 'an explicit 1-hour price');
SELECT is((SELECT cache_write_1h_per_mtok FROM runrow.model_price WHERE model = 'priced-1h'), 5::numeric,
    'is kept');
SELECT throws_ok($$SELECT runrow.set_model_price('priced-1h', 3, 15, 3.75, 0.3, -1)$$, '22023',
    'cache_write_1h_per_mtok must be NULL (2 x input_per_mtok) or a finite number, 0 or more, got -1',
    'a negative 1-hour price');
SELECT throws_ok($$SELECT runrow.set_model_price('priced-1h', NULL, NULL, NULL, NULL, 5)$$, '22023',
    'cache_write_1h_per_mtok must be NULL when the price is removed (the four prices NULL)',
    'a 1-hour price with a removal');
SELECT pg_temp.fleet_run(cost => 1, model => 'unpriced') AS c2 \gset
SELECT is(pg_temp.acquire(:'c2'), '(f,,budget_exhausted)', 'a cost budget on a model without a price: refused');
SELECT alike((SELECT error FROM runrow.agent_run WHERE id = :'c2'), '%has no price (set_model_price)%',
    'and the error says how to fix it');

-- Tenant budget over the rolling day.
SELECT lives_ok($$SELECT runrow.set_tenant_budget('acme', 1000, NULL)$$, 'set_tenant_budget');
SELECT pg_temp.fleet_run(tenant => 'acme') AS t1 \gset
SELECT pg_temp.fleet_run(tenant => 'acme') AS t2 \gset
SELECT pg_temp.step(:'t1', '{"input_tokens": 600}');
SELECT is(pg_temp.acquire(:'t2'), '(t,0,)', 'the tenant under its budget: granted');
SELECT pg_temp.step(:'t2', '{"input_tokens": 600}');
SELECT is(pg_temp.acquire(:'t1'), '(f,,budget_exhausted)', 'crossed by two runs: the other run is refused too');
SELECT is((SELECT (fairness_key, tokens, over_budget)::text FROM runrow.tenant_budgets WHERE fairness_key = 'acme'),
    '(acme,1200,t)', 'tenant_budgets shows the spend');
SELECT is((SELECT count(*)::int FROM runrow.tenants_over_budget WHERE fairness_key = 'acme'), 1,
    'tenants_over_budget lists the tenant');
UPDATE runrow.spend_hour SET hour = hour - interval '25 hours' WHERE fairness_key = 'acme';
SELECT is((SELECT status FROM runrow.agent_run WHERE id = :'t2'), 'running',
    'the run whose step crossed the tenant budget is marked, not yet ended');
SELECT pg_temp.fleet_run(tenant => 'acme') AS t3 \gset
SELECT is(pg_temp.acquire(:'t3'), '(t,0,)', 'a day later the spend has rolled out of the budget');

-- A retry-after of 1e-1000 is more than 0; its cast to a double underflowed (22003). It blocks
-- for the shortest time runrow counts, a millisecond.
SELECT runrow.set_rate_limit('k-tiny', 10, NULL, NULL);
SELECT pg_temp.fleet_run('k-tiny') AS tiny \gset
SELECT lives_ok(format('SELECT runrow.report_rate_limited(%L, %L, 1e-1000)', :'tiny', pg_temp.token(:'tiny')),
    'a retry-after too small for a double is taken');
SELECT is((SELECT blocked_until - now() FROM runrow.rate_limit WHERE rate_limit_key = 'k-tiny'), interval '0.001 seconds',
    'and blocks the key for a millisecond');

SELECT * FROM finish();
ROLLBACK;
