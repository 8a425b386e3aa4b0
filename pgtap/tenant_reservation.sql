-- functions/_tenant_reservation.sql's private helpers, called directly (acquire_model_call's
-- rules with them are in tenant_reserved.sql): _tenant_room (does a day of tokens and cost fit
-- a budget), _tenant_reserve (count a call on its tenant, or say why it must wait or end) and
-- _tenant_unreserve (take a call's reservation out), and the trigger keeping the total the sum
-- of the rows.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(17);
SELECT pg_temp.drain_queue();

SELECT runrow.set_model_price('tr-model', 3, 15, 3.75, 0.3);
SELECT runrow.set_tenant_budget('tr-tenant', 3000, NULL);

CREATE FUNCTION pg_temp.claimed(tenant text) RETURNS runrow.agent_run LANGUAGE plpgsql AS $$
DECLARE run uuid; r runrow.agent_run;
BEGIN
    SELECT e.run_id INTO run FROM runrow.enqueue_run(
        conversation_id => gen_random_uuid(), content => '"hi"', model => 'tr-model', user_id => tenant) AS e;
    PERFORM pg_temp.claim(run);
    SELECT a.* INTO r FROM runrow.agent_run AS a WHERE a.id = run;
    RETURN r;
END $$;
CREATE FUNCTION pg_temp.total(tenant text DEFAULT 'tr-tenant') RETURNS text LANGUAGE sql AS $$
    SELECT (reserved_tokens, reserved_cost::numeric(12, 6))::text FROM runrow.tenant_budget WHERE fairness_key = tenant
$$;
CREATE FUNCTION pg_temp.rows_sum(tenant text DEFAULT 'tr-tenant') RETURNS text LANGUAGE sql AS $$
    SELECT (coalesce(sum(tokens), 0), coalesce(sum(cost), 0)::numeric(12, 6))::text
    FROM runrow.tenant_reservation WHERE fairness_key = tenant
$$;

-- _tenant_room: both limits, each NULL for none, inclusive.
SELECT is(runrow._tenant_room(b, 3000, 99), true, '_tenant_room: a day at the token budget fits, no cost budget')
FROM runrow.tenant_budget AS b WHERE b.fairness_key = 'tr-tenant';
SELECT is(runrow._tenant_room(b, 3001, 0), false, '_tenant_room: one token past it does not')
FROM runrow.tenant_budget AS b WHERE b.fairness_key = 'tr-tenant';
SELECT is(runrow._tenant_room(b, 10, 10), true, '_tenant_room: NULL for NULL limits passes (no row)')
FROM (SELECT NULL::runrow.tenant_budget AS b) AS n;

-- _tenant_reserve: a tenant without a budget is not counted.
SELECT pg_temp.claimed('tr-free') AS free \gset
SELECT is(runrow._tenant_reserve(r, '{"input_tokens": 300, "output_tokens": 1000}'), NULL,
    '_tenant_reserve: a tenant without a budget goes')
FROM runrow.agent_run AS r WHERE r.id = (:'free'::runrow.agent_run).id;
SELECT is((SELECT count(*)::int FROM runrow.tenant_reservation WHERE fairness_key = 'tr-free'), 0, 'and nothing is counted');

-- A budgeted tenant's call is counted, priced at the model's price.
SELECT pg_temp.claimed('tr-tenant') AS a \gset
SELECT is(runrow._tenant_reserve(r, '{"input_tokens": 300, "output_tokens": 1000}'), NULL, '_tenant_reserve: room: goes')
FROM runrow.agent_run AS r WHERE r.id = (:'a'::runrow.agent_run).id;
SELECT is(pg_temp.total(), '(1300,0.015900)', 'its reservation is in the total, priced');
SELECT is(pg_temp.total(), pg_temp.rows_sum(), 'the total is the sum of the rows');
-- Asked again for the same run (its next call): replaced, not added.
SELECT is(runrow._tenant_reserve(r, '{"input_tokens": 200, "output_tokens": 1000}'), NULL, 'the run asks again')
FROM runrow.agent_run AS r WHERE r.id = (:'a'::runrow.agent_run).id;
SELECT is(pg_temp.total(), '(1200,0.015600)', 'its reservation replaced, not added');

-- A second call that would pass the budget beside it waits, and becomes the waiter.
SELECT pg_temp.claimed('tr-tenant') AS b \gset
SELECT is(runrow._tenant_reserve(r, '{"input_tokens": 800, "output_tokens": 1500}'), 'budget_reserved',
    '_tenant_reserve: 1200 + 2300 > 3000 with another call in flight: wait')
FROM runrow.agent_run AS r WHERE r.id = (:'b'::runrow.agent_run).id;
SELECT is((SELECT waiter_run FROM runrow.tenant_budget WHERE fairness_key = 'tr-tenant'), (:'b'::runrow.agent_run).id,
    'the first to wait is kept as the waiter');
SELECT is(pg_temp.total(), '(1200,0.015600)', 'a wait counts nothing');

-- _tenant_unreserve: the call in flight is done with; the waiter then goes, and is forgotten.
SELECT runrow._tenant_unreserve((:'a'::runrow.agent_run).id);
SELECT is(pg_temp.total(), '(0,0.000000)', '_tenant_unreserve: the reservation leaves the total');
SELECT is(runrow._tenant_reserve(r, '{"input_tokens": 800, "output_tokens": 1500}'), NULL, 'the waiter now goes')
FROM runrow.agent_run AS r WHERE r.id = (:'b'::runrow.agent_run).id;
SELECT is((SELECT waiter_run FROM runrow.tenant_budget WHERE fairness_key = 'tr-tenant'), NULL, 'and is no longer the waiter');
SELECT lives_ok(format('SELECT runrow._tenant_unreserve(%L)', gen_random_uuid()),
    '_tenant_unreserve of a run with nothing counted does nothing');

SELECT * FROM finish();
