-- runrow.record_usage: a response the API billed is paid for whether or not it became a step.
-- Happy path (the run's spend, the tenant's hour, the budgets), fenced out, bad input.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(19);
SELECT pg_temp.drain_queue();

CREATE FUNCTION pg_temp.spend_fingerprint() RETURNS text LANGUAGE sql AS $$
    SELECT concat_ws('|', pg_temp.fingerprint(),
        (SELECT md5(coalesce(string_agg(to_jsonb(s)::text, '' ORDER BY s.fairness_key, s.hour, s.model), ''))
         FROM runrow.spend_hour AS s),
        (SELECT md5(coalesce(string_agg(to_jsonb(l)::text, '' ORDER BY l.rate_limit_key), '')) FROM runrow.rate_limit AS l))
$$;
CREATE FUNCTION pg_temp.tenant_run(tenant text, tokens bigint DEFAULT NULL) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE run uuid;
BEGIN
    SELECT e.run_id INTO run FROM runrow.enqueue_run(
        conversation_id => gen_random_uuid(), content => '"hi"', model => 'priced-usage', user_id => tenant,
        rate_limit_key => 'k-usage', token_budget => tokens) AS e;
    PERFORM pg_temp.claim(run);
    RETURN run;
END $$;

SELECT has_function('runrow', 'record_usage', ARRAY['uuid', 'uuid', 'jsonb'],
    'record_usage(run_id, claim_token, usage) exists');
SELECT isnt(obj_description('runrow.record_usage(uuid, uuid, jsonb)'::regprocedure, 'pg_proc'), NULL,
    'it has a COMMENT stating its contract');

SELECT runrow.set_model_price('priced-usage', 3, 15, 3.75, 0.3);
SELECT runrow.set_rate_limit('k-usage', NULL, 100000, 100000);
SELECT runrow.set_tenant_budget('usage-tenant', 5000, NULL);

-- A stream cut after message_start: its input and cache write were billed, and are counted.
SELECT pg_temp.tenant_run('usage-tenant') AS cut \gset
SELECT is(runrow.record_usage(:'cut', pg_temp.token(:'cut'),
    '{"input_tokens": 1000, "output_tokens": 1, "cache_creation_input_tokens": 2000}'), true, 'recorded');
SELECT is((SELECT (spent_tokens, spent_cost::numeric(12, 6))::text FROM runrow.agent_run WHERE id = :'cut'),
    (3001, 0.010515)::text,
    'the run''s spend: 1000 in x 3 + 1 out x 15 + 2000 cache writes x 3.75 per million');
SELECT is((SELECT (model_calls, input_tokens, output_tokens, cache_write_tokens, tokens)::text
           FROM runrow.spend_hour WHERE fairness_key = 'usage-tenant'),
    (1, 1000, 1, 2000, 3001)::text, 'the tenant''s hour');
SELECT is((SELECT (input_tokens_left, output_tokens_left)::text FROM runrow.rate_limit WHERE rate_limit_key = 'k-usage'),
    (97000, 99999)::text, 'the key''s token buckets (uncached input and cache writes, output)');
SELECT is((SELECT status FROM runrow.agent_run WHERE id = :'cut'), 'running', 'the run goes on');
SELECT is(pg_temp.count_events(:'cut', 'model_turn'), 0, 'nothing journaled');
SELECT is((SELECT count(*)::int FROM runrow.agent_step WHERE run_id = :'cut'), 0, 'no step stored');

-- Responses that never became steps cross the tenant's budget: the next request is refused.
SELECT pg_temp.tenant_run('usage-tenant') AS next \gset
SELECT runrow.record_usage(:'cut', pg_temp.token(:'cut'), '{"input_tokens": 2500}');
SELECT is((SELECT (a.granted, a.reason)::text FROM runrow.acquire_model_call(:'next', pg_temp.token(:'next'), 10) AS a),
    '(f,budget_exhausted)', 'the tenant''s budget, crossed by unstored responses, refuses the next request');
SELECT pg_temp.tenant_run('other-tenant', tokens => 100) AS own \gset
SELECT runrow.record_usage(:'own', pg_temp.token(:'own'), '{"input_tokens": 150}');
SELECT is((SELECT budget_exhausted IS NOT NULL FROM runrow.agent_run WHERE id = :'own'), true,
    'and so is the run''s own token_budget');

-- Fenced out: a wrong token, a run that has ended; nothing written.
SELECT pg_temp.spend_fingerprint() AS before \gset
SELECT is(runrow.record_usage(:'next', gen_random_uuid(), '{"input_tokens": 10}'), false, 'a wrong token: false');
SELECT is(pg_temp.spend_fingerprint(), :'before', 'a wrong token: nothing written');
SELECT pg_temp.token(:'own') AS own_token \gset
SELECT runrow.finish_run(:'own', :'own_token', 'completed');
SELECT pg_temp.spend_fingerprint() AS before \gset
SELECT is(runrow.record_usage(:'own', :'own_token', '{"input_tokens": 10}'), false, 'an ended run: false');
SELECT is(pg_temp.spend_fingerprint(), :'before', 'fenced out: nothing written');

-- Bad input names the argument and writes nothing.
SELECT throws_ok(format('SELECT runrow.record_usage(NULL, %L, %L)', gen_random_uuid(), '{}'),
    '22004', 'run_id must not be NULL', 'run_id NULL');
SELECT throws_ok(format('SELECT runrow.record_usage(%L, %L, NULL)', :'next', gen_random_uuid()),
    '22004', 'usage must not be NULL', 'usage NULL');
SELECT throws_ok(format('SELECT runrow.record_usage(%L, %L, %L)', :'next', gen_random_uuid(), '[1]'),
    '22023', 'usage must be a JSON object (the response''s usage), got array', 'usage not an object');
SELECT is(pg_temp.spend_fingerprint(), :'before', 'bad input: nothing written');

SELECT * FROM finish();
ROLLBACK;
