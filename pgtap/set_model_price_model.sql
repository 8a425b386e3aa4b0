-- runrow.set_model_price's model: the name a run's model is matched by, so refused by the rule
-- enqueue_run, create_schedule and fork_run apply to a run's model (no white space at either
-- end, _model_trimmed): the SQL audit stored ' pm ' and E'pm\n', prices no run could ever
-- match, a typo that looked set. A price stored before the rule is still removed by its name.
-- The prices' own rules are tested in fleet_limits.sql and server_tool_prices.sql.
BEGIN;
\ir helpers/setup.psql
SELECT plan(9);

CREATE FUNCTION pg_temp.prices() RETURNS text LANGUAGE sql AS $$
    SELECT md5(coalesce(string_agg(to_jsonb(p)::text, '' ORDER BY p.model), '')) FROM runrow.model_price AS p
$$;
SELECT pg_temp.prices() AS before \gset

SELECT throws_ok($$SELECT runrow.set_model_price(' pm ', 3, 15, 3.75, 0.3)$$, '22023',
    'model must not begin or end with white space, got " pm "', 'a model with spaces around it');
SELECT throws_ok($$SELECT runrow.set_model_price(E'pm\n', 3, 15, 3.75, 0.3)$$, '22023',
    'model must not hold control characters (C0, C1 or bidirectional formatting), got U+000A at character 3',
    'a model with a trailing newline: named by code point, not quoted into the log');
SELECT throws_ok(format('SELECT runrow.set_model_price(%L, 3, 15, 3.75, 0.3)', E'\u00a0pm'), '22023',
    format('model must not begin or end with white space, got "%s"', E'\u00a0pm'), 'a leading no-break space');
SELECT throws_ok($$SELECT runrow.set_model_price(' pm', 3, 15, 3.75, 0.3, 6, 0.02, 0.001)$$, '22023',
    'model must not begin or end with white space, got " pm"', 'with the optional prices too');
SELECT is(pg_temp.prices(), :'before', 'nothing was stored');

-- The rule enqueue_run applies, word for word.
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', ' pm ')$$, '22023',
    'model must not begin or end with white space, got " pm "', 'enqueue_run refuses the same model alike');

SELECT lives_ok($$SELECT runrow.set_model_price('p m', 3, 15, 3.75, 0.3)$$,
    'white space inside a model name is the API''s to judge, as enqueue_run leaves it');

-- A price stored before the rule is removed by its name (all four prices NULL).
INSERT INTO runrow.model_price (model, input_per_mtok, output_per_mtok, cache_write_per_mtok, cache_read_per_mtok,
    cache_write_1h_per_mtok)
VALUES (' legacy ', 1, 1, 1, 1, 2);
SELECT lives_ok($$SELECT runrow.set_model_price(' legacy ', NULL, NULL, NULL, NULL)$$,
    'a price stored before the rule is still removed by its name');
SELECT is((SELECT count(*)::int FROM runrow.model_price WHERE model = ' legacy '), 0, 'and is gone');

SELECT * FROM finish();
ROLLBACK;
