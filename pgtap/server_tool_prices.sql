-- Server tools priced per request (migration 0076): set_model_price's web_search_per_request and
-- web_fetch_per_request (happy path, the NULL defaults, bad input naming the argument), and
-- their settlement by append_step and record_usage from usage.server_tool_use into the run's
-- spent_cost, the tenant's day and the budgets. The audit's case: 50 searches, 25 input and 10
-- output tokens at 3/15 USD per million, counted 0.000225 USD, billed 0.500225.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(31);
SELECT pg_temp.drain_queue();

CREATE FUNCTION pg_temp.price_fingerprint() RETURNS text LANGUAGE sql AS $$
    SELECT concat_ws('|', pg_temp.fingerprint(),
        (SELECT md5(coalesce(string_agg(to_jsonb(p)::text, '' ORDER BY p.model), '')) FROM runrow.model_price AS p))
$$;
CREATE FUNCTION pg_temp.priced_run(model text, cost numeric DEFAULT NULL, tenant text DEFAULT NULL)
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE run uuid;
BEGIN
    SELECT e.run_id INTO run FROM runrow.enqueue_run(
        conversation_id => gen_random_uuid(), content => '"hi"', model => model, user_id => tenant,
        cost_budget => cost) AS e;
    PERFORM pg_temp.claim(run);
    RETURN run;
END $$;
CREATE FUNCTION pg_temp.step(run uuid, usage jsonb) RETURNS int LANGUAGE sql AS $$
    SELECT runrow.append_step(run, pg_temp.token(run), 'model_turn',
        json_build_array(json_build_object('type', 'text', 'text', 'found it')), NULL, usage, 'end_turn')
$$;
CREATE FUNCTION pg_temp.acquire(run uuid) RETURNS text LANGUAGE sql AS $$
    SELECT (a.granted, a.reason)::text FROM runrow.acquire_model_call(run, pg_temp.token(run), 10) AS a
$$;

SELECT has_function('runrow', 'set_model_price',
    ARRAY['text', 'numeric', 'numeric', 'numeric', 'numeric', 'numeric', 'numeric', 'numeric'],
    'set_model_price takes the server-tool prices');
SELECT hasnt_function('runrow', 'set_model_price', ARRAY['text', 'numeric', 'numeric', 'numeric', 'numeric', 'numeric'],
    'and its six-argument form is gone (a call of five or six arguments is not ambiguous)');

-- NULL (not given): the documented prices, 0.01 USD per search (10 per 1,000), 0 per fetch.
SELECT lives_ok($$SELECT runrow.set_model_price('web-priced', 3, 15, 3.75, 0.3)$$, 'the five-argument call works');
SELECT is((SELECT (web_search_per_request, web_fetch_per_request)::text FROM runrow.model_prices
           WHERE model = 'web-priced'), '(0.01,0)', 'not given: the documented prices, shown by model_prices');
SELECT lives_ok($$SELECT runrow.set_model_price('web-six', 3, 15, 3.75, 0.3, 5)$$, 'the six-argument call works');
SELECT is((SELECT (cache_write_1h_per_mtok, web_search_per_request)::text FROM runrow.model_price
           WHERE model = 'web-six'), '(5,0.01)', 'with the documented search price');
SELECT lives_ok($$SELECT runrow.set_model_price('web-custom', 3, 15, 3.75, 0.3, NULL, 0.02, 0.001)$$,
    'explicit server-tool prices');
SELECT is((SELECT (cache_write_1h_per_mtok, web_search_per_request, web_fetch_per_request)::text
           FROM runrow.model_prices WHERE model = 'web-custom'), '(6,0.02,0.001)', 'are kept');
SELECT lives_ok($$SELECT runrow.set_model_price(model => 'web-free', input_per_mtok => 3, output_per_mtok => 15,
    cache_write_per_mtok => 3.75, cache_read_per_mtok => 0.3, web_search_per_request => 0)$$,
    'a search price of 0, by name');
SELECT is((SELECT web_search_per_request FROM runrow.model_price WHERE model = 'web-free'), 0::numeric,
    '0 leaves searches unpriced');

-- Bad input names the argument and writes nothing.
SELECT pg_temp.price_fingerprint() AS before \gset
SELECT throws_ok($$SELECT runrow.set_model_price('web-priced', 3, 15, 3.75, 0.3, NULL, -1)$$, '22023',
    'web_search_per_request must be NULL (0.01, the documented 10 USD per 1,000 searches) or a finite number, '
    '0 or more (USD per search), got -1', 'a negative search price');
SELECT throws_ok($$SELECT runrow.set_model_price('web-priced', 3, 15, 3.75, 0.3, NULL, 'NaN')$$, '22023',
    'web_search_per_request must be NULL (0.01, the documented 10 USD per 1,000 searches) or a finite number, '
    '0 or more (USD per search), got NaN', 'a NaN search price');
SELECT throws_ok($$SELECT runrow.set_model_price('web-priced', 3, 15, 3.75, 0.3, NULL, NULL, 'Infinity')$$, '22023',
    'web_fetch_per_request must be NULL (0, no fee beyond the tokens) or a finite number, 0 or more (USD per '
    'fetch), got Infinity', 'an infinite fetch price');
SELECT throws_ok($$SELECT runrow.set_model_price('web-priced', NULL, NULL, NULL, NULL, NULL, 0.01)$$, '22023',
    'web_search_per_request must be NULL when the price is removed (the four prices NULL)',
    'a search price with a removal');
SELECT throws_ok($$SELECT runrow.set_model_price('web-priced', NULL, NULL, NULL, NULL, NULL, NULL, 0)$$, '22023',
    'web_fetch_per_request must be NULL when the price is removed (the four prices NULL)',
    'a fetch price with a removal');
SELECT is(pg_temp.price_fingerprint(), :'before', 'bad input wrote nothing');
SELECT throws_ok($$INSERT INTO runrow.model_price (model, input_per_mtok, output_per_mtok, cache_write_per_mtok,
    cache_read_per_mtok, cache_write_1h_per_mtok, web_search_per_request) VALUES ('m-nan', 1, 1, 1, 1, 2, 'NaN')$$,
    '23514', NULL, 'model_price refuses a NaN search price, whoever writes it');

-- append_step: the audit's turn. 25 in x 3 + 10 out x 15 per million = 0.000225, + 50 x 0.01.
SELECT pg_temp.priced_run('web-priced', cost => 0.1) AS s1 \gset
SELECT pg_temp.step(:'s1', '{"input_tokens": 25, "output_tokens": 10,
    "server_tool_use": {"web_search_requests": 50, "web_fetch_requests": 3}}');
SELECT is((SELECT spent_cost FROM runrow.agent_run WHERE id = :'s1'), 0.500225::numeric,
    '50 searches at 0.01 are spent, beside the tokens (fetches at 0)');
SELECT is((SELECT spent_tokens FROM runrow.agent_run WHERE id = :'s1'), 35::bigint, 'requests are not tokens');
SELECT is(pg_temp.acquire(:'s1'), '(f,budget_exhausted)', 'and cross a cost budget of 0.1 USD');
SELECT is((SELECT error FROM runrow.agent_run WHERE id = :'s1'),
    'budget_exhausted: the run cost 0.500225 USD of its cost_budget of 0.1 USD', 'the error says what it cost');
-- Explicit prices: 10 searches x 0.02 + 5 fetches x 0.001.
SELECT pg_temp.priced_run('web-custom') AS s2 \gset
SELECT pg_temp.step(:'s2', '{"server_tool_use": {"web_search_requests": 10, "web_fetch_requests": 5}}');
SELECT is((SELECT spent_cost FROM runrow.agent_run WHERE id = :'s2'), 0.205::numeric,
    'each server tool at its own price');
SELECT pg_temp.priced_run('web-free') AS s3 \gset
SELECT pg_temp.step(:'s3', '{"server_tool_use": {"web_search_requests": 50}}');
SELECT is((SELECT spent_cost FROM runrow.agent_run WHERE id = :'s3'), 0::numeric, 'a price of 0 costs nothing');

-- Odd usage: what is not a count of 0 or more counts 0 (as a token field), a fraction is floored.
SELECT pg_temp.priced_run('web-priced') AS odd \gset
SELECT pg_temp.step(:'odd', '{"server_tool_use": "lots"}');
SELECT pg_temp.step(:'odd', '{"server_tool_use": [50]}');
SELECT pg_temp.step(:'odd', '{"server_tool_use": null}');
SELECT pg_temp.step(:'odd', '{"server_tool_use": {"web_search_requests": "50", "web_fetch_requests": null}}');
SELECT pg_temp.step(:'odd', '{"server_tool_use": {"web_search_requests": -5, "web_fetch_requests": true}}');
SELECT is((SELECT (spent_cost = 0, status)::text FROM runrow.agent_run WHERE id = :'odd'), '(t,running)',
    'a server_tool_use that is not an object, a count that is a string, null, negative or true: 0');
SELECT pg_temp.step(:'odd', '{"server_tool_use": {"web_search_requests": 2.7}}');
SELECT is((SELECT spent_cost FROM runrow.agent_run WHERE id = :'odd'), 0.02::numeric, 'a fraction is floored');
SELECT pg_temp.step(:'odd', '{"server_tool_use": {"web_search_requests": 1e300}}');
SELECT is((SELECT spent_cost FROM runrow.agent_run WHERE id = :'odd'), 10000000000000.02::numeric,
    'a huge count is capped (1e15 requests), not an overflow');

-- record_usage (a response not stored as a step) and the tenant's day.
SELECT runrow.set_tenant_budget('web-tenant', NULL, 0.4);
SELECT pg_temp.priced_run('web-priced', tenant => 'web-tenant') AS cut \gset
SELECT pg_temp.priced_run('web-priced', tenant => 'web-tenant') AS other \gset
SELECT is(runrow.record_usage(:'cut', pg_temp.token(:'cut'),
    '{"input_tokens": 25, "output_tokens": 10, "server_tool_use": {"web_search_requests": 50}}'), true,
    'record_usage with 50 searches');
SELECT is((SELECT spent_cost FROM runrow.agent_run WHERE id = :'cut'), 0.500225::numeric,
    'are in the run''s spent_cost');
SELECT is((SELECT sum(cost) FROM runrow.spend_hour WHERE fairness_key = 'web-tenant'), 0.500225::numeric,
    'and in the tenant''s day');
SELECT is(pg_temp.acquire(:'other'), '(f,budget_exhausted)', 'which crosses its 0.4 USD per day: refused');
SELECT is((SELECT error FROM runrow.agent_run WHERE id = :'other'),
    'budget_exhausted: tenant "web-tenant" spent 0.500225 USD of its 0.4 USD per day', 'for the searches');

SELECT * FROM finish();
ROLLBACK;
