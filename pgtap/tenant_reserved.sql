-- A tenant's calls in flight count against its budget (migration 0088): acquire_model_call
-- decides with the settled spend plus the reservations of the tenant's granted, unsettled calls
-- (tenant_budget.reserved_tokens / reserved_cost, the sum of its tenant_reservation rows). A call
-- that would carry them past the budget waits (budget_reserved) while another is in flight, and
-- goes alone; the settle, the reap's charge, a 429, a key error, a deferral and a release take a
-- reservation out; a claim that ended unsettled another way is pruned by the next grant that
-- would wait. Before 0088 every grant here was granted: the tenant's runs in flight each crossed
-- its budget.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(71);
SELECT pg_temp.drain_queue();

SELECT runrow.set_model_price('held-model', 3, 15, 3.75, 0.3);
SELECT runrow.set_tenant_budget('held-tenant', 3000, NULL);
SELECT runrow.set_rate_limit('held-key', 100, NULL, NULL);

-- A run of `tenant` claimed: max_tokens 1000, so a grant with the estimate 300 reserves 1300
-- tokens, 300 x 3 + 1000 x 15 per million = 0.0159 USD.
CREATE FUNCTION pg_temp.held_run(tenant text DEFAULT 'held-tenant', attempts int DEFAULT 3) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE run uuid;
BEGIN
    SELECT e.run_id INTO run FROM runrow.enqueue_run(
        conversation_id => gen_random_uuid(), content => '"hi"', model => 'held-model', user_id => tenant,
        metadata => '{"max_tokens": 1000}', max_attempts => attempts, rate_limit_key => 'held-key') AS e;
    PERFORM pg_temp.claim(run);
    RETURN run;
END $$;
CREATE FUNCTION pg_temp.acquire(run uuid) RETURNS text LANGUAGE sql AS $$
    SELECT (a.granted, a.wait_seconds, a.reason)::text
    FROM runrow.acquire_model_call(run, pg_temp.token(run), 300) AS a
$$;
CREATE FUNCTION pg_temp.reserved(tenant text DEFAULT 'held-tenant') RETURNS text LANGUAGE sql AS $$
    SELECT (reserved_tokens, reserved_cost::numeric(12, 6))::text FROM runrow.tenant_budget WHERE fairness_key = tenant
$$;
CREATE FUNCTION pg_temp.held(tenant text DEFAULT 'held-tenant') RETURNS uuid[] LANGUAGE sql AS $$
    SELECT coalesce(array_agg(run_id ORDER BY run_id), '{}') FROM runrow.tenant_reservation WHERE fairness_key = tenant
$$;
CREATE FUNCTION pg_temp.turn(run uuid, usage jsonb) RETURNS integer LANGUAGE sql AS $$
    SELECT runrow.append_step(run, pg_temp.token(run), 'model_turn',
        json_build_array(json_build_object('type', 'text', 'text', 'ok')), NULL, usage, 'tool_use')
$$;
CREATE FUNCTION pg_temp.requests_left() RETURNS numeric LANGUAGE sql AS $$
    SELECT requests_left FROM runrow.rate_limit WHERE rate_limit_key = 'held-key'
$$;

-- Happy path: a grant is counted on its tenant.
SELECT pg_temp.held_run() AS a \gset
SELECT is(pg_temp.acquire(:'a'), '(t,0,)', 'granted');
SELECT is(pg_temp.reserved(), '(1300,0.015900)', 'the tenant''s total holds the call''s reservation, priced');
SELECT is(pg_temp.held(), ARRAY[:'a'::uuid], 'one reservation row, the run''s');
SELECT pg_temp.held_run() AS b \gset
SELECT is(pg_temp.acquire(:'b'), '(t,0,)', 'a second call fits: 1300 + 1300 <= 3000');
SELECT is(pg_temp.reserved(), '(2600,0.031800)', 'both counted');

-- A third would carry settled + reserved past the budget: it waits, and takes nothing.
SELECT pg_temp.held_run() AS c \gset
SELECT pg_temp.requests_left() AS left_before \gset
SELECT is(pg_temp.acquire(:'c'), '(f,15,budget_reserved)', '0 + 2600 + 1300 > 3000: the call waits, longer than a worker waits in place (it defers)');
SELECT is(pg_temp.reserved(), '(2600,0.031800)', 'nothing more reserved');
SELECT is((SELECT (status, model_call_reserved)::text FROM runrow.agent_run WHERE id = :'c'), '(running,)',
    'the run keeps its claim and has no grant');
SELECT is(pg_temp.requests_left(), :'left_before'::numeric, 'its key''s request was not taken');

-- The settle frees it: the real usage joins the spend, the reservation leaves the total.
SELECT pg_temp.turn(:'a', '{"input_tokens": 100, "output_tokens": 50}');
SELECT is(pg_temp.reserved(), '(1300,0.015900)', 'append_step takes the settled call''s reservation out');
SELECT is(pg_temp.acquire(:'c'), '(t,0,)', 'now 150 + 1300 + 1300 <= 3000: granted');
SELECT is(pg_temp.held(), (SELECT array_agg(x ORDER BY x) FROM unnest(ARRAY[:'b'::uuid, :'c'::uuid]) AS x),
    'b and c in flight');

-- The reap charges the dead holder's reservation and frees it, once.
SELECT pg_temp.expire(:'b');
SELECT is((SELECT r.outcome FROM runrow.reap_expired_runs(grace_seconds => 0) AS r WHERE r.run_id = :'b'),
    'requeued', 'b''s holder died mid-call');
SELECT is((SELECT sum(tokens)::bigint FROM runrow.spend_hour WHERE fairness_key = 'held-tenant'), 1450::bigint,
    'the reservation is charged: 150 + 1300');
SELECT is(pg_temp.reserved(), '(1300,0.015900)', 'and out of the total');
SELECT runrow.cancel_run(:'b');

-- A release (a 5xx: no answer, not billed) drops it.
SELECT pg_temp.held_run() AS d \gset
SELECT is(pg_temp.acquire(:'d'), '(f,15,budget_reserved)', '1450 + 1300 + 1300 > 3000: waits');
SELECT runrow.release_run(:'c', pg_temp.token(:'c'), 'model API 503', interval '1 hour');
SELECT is(pg_temp.reserved(), '(0,0.000000)', 'release_run drops the released claim''s reservation');
SELECT is(pg_temp.acquire(:'d'), '(t,0,)', 'alone it goes');
SELECT runrow.cancel_run(:'c');

-- A claim that never reserved (most: no model call yet, or its call settled) pays nothing for
-- it when it ends: release_run and the reaper (_end_claim) call _tenant_unreserve only for a
-- run with a grant, as finish_run does. Before, they called it for every run they ended.
SET LOCAL track_functions = 'all';
CREATE FUNCTION pg_temp.unreserves() RETURNS bigint LANGUAGE sql AS $$
    SELECT coalesce(pg_stat_get_xact_function_calls('runrow._tenant_unreserve'::regproc), 0)
$$;
SELECT runrow.set_tenant_budget('end-tenant', 100000, NULL);
SELECT pg_temp.held_run('end-tenant', 5) AS never \gset
SELECT pg_temp.unreserves() AS unreserves_before \gset
SELECT is(runrow.release_run(:'never', pg_temp.token(:'never'), 'model API 503'), 'requeued',
    'a run with no grant is released');
SELECT pg_temp.claim(:'never');
SELECT pg_temp.expire(:'never');
SELECT is((SELECT r.outcome FROM runrow.reap_expired_runs(grace_seconds => 0) AS r WHERE r.run_id = :'never'),
    'requeued', 'and reaped');
SELECT is(pg_temp.unreserves() - :unreserves_before, 0::bigint,
    'neither ending looked for a reservation it cannot have');
SELECT pg_temp.claim(:'never');
SELECT is(pg_temp.acquire(:'never'), '(t,0,)', 'granted, it has one');
SELECT is(runrow.release_run(:'never', pg_temp.token(:'never'), 'model API 503'), 'requeued', 'released');
SELECT is(pg_temp.unreserves() - :unreserves_before, 1::bigint, 'that release takes it out');
SELECT is(pg_temp.reserved('end-tenant'), '(0,0.000000)', 'and the tenant''s total is back to 0');
SELECT runrow.cancel_run(:'never');

-- A claim that ended with its call unsettled (a refused request fails the run through
-- finish_run, or through finish_runs and finish_and_claim_runs, the worker's batch endings): its
-- reservation leaves the total then (the review of session 59: before, it stayed until a grant
-- that would wait pruned it; the batch endings left it so until session 60).
SELECT runrow.finish_run(:'d', pg_temp.token(:'d'), 'failed', NULL, 'model API refused the request: 400');
SELECT is(pg_temp.reserved(), '(0,0.000000)', 'finish_run takes the refused call''s reservation out');
CREATE FUNCTION pg_temp.failed(run uuid) RETURNS jsonb LANGUAGE sql AS $$
    SELECT jsonb_build_array(jsonb_build_object('run_id', run, 'claim_token', pg_temp.token(run),
        'status', 'failed', 'error', 'model API refused the request: 400'))
$$;
SELECT runrow.set_tenant_budget('batch-tenant', 100000, NULL);
SELECT pg_temp.held_run() AS fr \gset
SELECT pg_temp.held_run('batch-tenant') AS fr2 \gset
SELECT pg_temp.held_run('free-tenant') AS fr3 \gset
SELECT is(pg_temp.acquire(:'fr'), '(t,0,)', 'granted');
SELECT is(pg_temp.acquire(:'fr2'), '(t,0,)', 'a call of another tenant, granted');
SELECT is(pg_temp.acquire(:'fr3'), '(t,0,)', 'and of a tenant without a budget');
SELECT pg_temp.held_run() AS fine \gset
SELECT is(
    (SELECT array_agg(f.finished) FROM runrow.finish_runs(pg_temp.failed(:'fr') || pg_temp.failed(:'fr2')
        || pg_temp.failed(:'fr3') || jsonb_build_array(jsonb_build_object('run_id', :'fine',
            'claim_token', pg_temp.token(:'fine'), 'status', 'completed'))) AS f),
    ARRAY[true, true, true, true], 'finish_runs ends the refused calls'' runs and one that never reserved');
SELECT is((pg_temp.reserved(), pg_temp.reserved('batch-tenant'))::text, '("(0,0.000000)","(0,0.000000)")',
    'finish_runs takes each tenant''s refused call out of its total');
SELECT is((SELECT count(*)::int FROM runrow.tenant_reservation WHERE run_id IN (:'fr', :'fr2', :'fr3', :'fine')), 0,
    'no reservation row is left for a run it ended');
SELECT pg_temp.held_run('batch-tenant') AS fc \gset
SELECT is(pg_temp.acquire(:'fc'), '(t,0,)', 'granted');
SELECT is(
    (SELECT array_agg(f.finished) FROM runrow.finish_and_claim_runs(pg_temp.failed(:'fc'), 'pgtap', 1, 30) AS f
     WHERE f.finished IS NOT NULL),
    ARRAY[true], 'finish_and_claim_runs ends a refused call''s run');
SELECT is(pg_temp.reserved('batch-tenant'), '(0,0.000000)', 'and takes its reservation out too');
-- A stale row (a claim ended unsettled before migration 0097 took a stop's and a park's out too,
-- pgtap/tenant_reservation_stop_park.sql): the next grant that would wait finds it stale.
INSERT INTO runrow.tenant_reservation (run_id, fairness_key, claim_token, tokens, cost)
VALUES (:'fr', 'held-tenant', gen_random_uuid(), 1300, 0.0159);
SELECT is(pg_temp.reserved(), '(1300,0.015900)', 'a stale reservation');
SELECT pg_temp.held_run() AS e \gset
SELECT is(pg_temp.acquire(:'e'), '(t,0,)', 'the next grant that would wait finds it stale: granted');
SELECT is(pg_temp.held(), ARRAY[:'e'::uuid], 'fr''s row is gone, e''s counted');
SELECT is(pg_temp.reserved(), '(1300,0.015900)', 'the total is e''s alone');

-- Alone a call goes even across the budget (as a run's one step always could); the next waits,
-- and the settled spend alone at the budget ends the run.
SELECT pg_temp.turn(:'e', '{"input_tokens": 1450}');
SELECT pg_temp.held_run() AS f \gset
SELECT is(pg_temp.acquire(:'f'), '(t,0,)', '2900 settled + 1300 > 3000, but nothing else in flight: granted');
SELECT pg_temp.held_run() AS g \gset
SELECT is(pg_temp.acquire(:'g'), '(f,15,budget_reserved)', 'with f in flight, g waits');
SELECT is(pg_temp.acquire(:'g'), '(f,15,budget_reserved)', 'and waits again: a wait changes nothing');
SELECT pg_temp.turn(:'e', '{"input_tokens": 200}');
SELECT is(pg_temp.acquire(:'g'), '(f,,budget_exhausted)', '3100 settled: g ends');
SELECT is((SELECT (status, error)::text FROM runrow.agent_run WHERE id = :'g'),
    ('failed', 'budget_exhausted: tenant "held-tenant" used 3100 tokens of its 3000 per day')::text,
    'failed for the tenant''s budget');
SELECT is(pg_temp.held(), ARRAY[:'f'::uuid], 'f''s call is granted, not yet settled (asked again after a refusal)');
SELECT is(pg_temp.acquire(:'f'), '(f,,budget_exhausted)', 'f asks again: it ends for the budget');
SELECT is(pg_temp.reserved(), '(0,0.000000)', 'and its unsettled call''s reservation leaves the total');
SELECT runrow.finish_run(:'e', pg_temp.token(:'e'), 'completed');

-- A cost budget counts the priced reservations; a 429, a key error and a deferral drop them.
SELECT runrow.set_tenant_budget('cost-tenant', NULL, 0.03);
SELECT pg_temp.held_run('cost-tenant') AS h \gset
SELECT pg_temp.held_run('cost-tenant') AS i \gset
SELECT is(pg_temp.acquire(:'h'), '(t,0,)', 'a cost budget: granted');
SELECT is(pg_temp.acquire(:'i'), '(f,15,budget_reserved)', '0.0159 + 0.0159 > 0.03 USD: waits');
SELECT runrow.report_rate_limited(:'h', pg_temp.token(:'h'), 0.001);
SELECT is(pg_temp.reserved('cost-tenant'), '(0,0.000000)', 'a 429 drops it');
DELETE FROM runrow.rate_limit WHERE rate_limit_key = 'held-key';  -- the block, over (now() stands still here)
SELECT is(pg_temp.acquire(:'i'), '(t,0,)', 'i goes');
SELECT runrow.report_key_error(:'i', pg_temp.token(:'i'), 'invalid x-api-key', 0.001, 0.001);
SELECT is(pg_temp.reserved('cost-tenant'), '(0,0.000000)', 'a key error drops it');
DELETE FROM runrow.rate_limit WHERE rate_limit_key = 'held-key';
SELECT is(pg_temp.acquire(:'h'), '(t,0,)', 'h asks again: granted');
SELECT runrow.defer_run(:'h', pg_temp.token(:'h'), interval '1 second', 'rate_limited: waiting');
SELECT is(pg_temp.reserved('cost-tenant'), '(0,0.000000)', 'a deferral drops it');

-- A tenant without a budget: nothing counted.
SELECT pg_temp.held_run('free-tenant') AS j \gset
SELECT is(pg_temp.acquire(:'j'), '(t,0,)', 'no budget: granted');
SELECT is(pg_temp.held('free-tenant'), '{}'::uuid[], 'and nothing counted');

-- Fenced out and bad input: no row, nothing written, the total unchanged.
SELECT pg_temp.held_run('cost-tenant') AS k \gset
SELECT pg_temp.acquire(:'k');
SELECT pg_temp.fingerprint() AS fp \gset
SELECT is_empty(format('SELECT * FROM runrow.acquire_model_call(%L, gen_random_uuid(), 300)', :'k'),
    'a stale token: no row');
SELECT throws_ok(format('SELECT * FROM runrow.acquire_model_call(%L, %L, -1)', :'k', pg_temp.token(:'k')),
    '22023', NULL, 'an estimate below 0: 22023');
SELECT throws_ok('SELECT * FROM runrow.acquire_model_call(NULL, gen_random_uuid(), 1)', '22004', NULL,
    'a NULL run_id: 22004');
SELECT is(pg_temp.fingerprint(), :'fp', 'nothing written');
SELECT is(pg_temp.reserved('cost-tenant'), '(1300,0.015900)', 'the total unchanged');

-- First come, first served (migration 0091): a large call waiting for room is not starved by
-- smaller calls taking turns in flight. Budget 91000; the large call reserves 90300, the small
-- ones 1300. Before, every small call was granted beside the other's and the large one waited
-- forever (the review of session 59: 30 asks, never granted).
SELECT runrow.set_tenant_budget('fair-tenant', 91000, NULL);
SELECT e.run_id AS big FROM runrow.enqueue_run(conversation_id => gen_random_uuid(), content => '"hi"',
    model => 'held-model', user_id => 'fair-tenant', metadata => '{"max_tokens": 90000}',
    rate_limit_key => 'held-key') AS e \gset
SELECT pg_temp.claim(:'big');
SELECT pg_temp.held_run('fair-tenant') AS s1 \gset
SELECT pg_temp.held_run('fair-tenant') AS s2 \gset
SELECT pg_temp.held_run('fair-tenant') AS s3 \gset
SELECT is(pg_temp.acquire(:'s1'), '(t,0,)', 'a small call is granted');
SELECT is(pg_temp.acquire(:'big'), '(f,15,budget_reserved)', 'the large one does not fit beside it: it waits');
SELECT is((SELECT (waiter_run, waiter_tokens)::text FROM runrow.tenant_budget WHERE fairness_key = 'fair-tenant'),
    format('(%s,90300)', :'big'), 'it is the tenant''s waiter');
SELECT is(pg_temp.acquire(:'s2'), '(f,15,budget_reserved)',
    'a newer small call that fits beside s1 but not beside the waiter waits behind it');
SELECT pg_temp.turn(:'s1', '{"input_tokens": 100, "output_tokens": 100}');
SELECT is(pg_temp.acquire(:'big'), '(t,0,)', 's1 settled: the waiter goes');
SELECT is((SELECT waiter_run FROM runrow.tenant_budget WHERE fairness_key = 'fair-tenant'), NULL,
    'granted, it is no longer the waiter');
-- A waiter that stopped asking for a minute is forgotten: the next call to wait takes its place.
SELECT is(pg_temp.acquire(:'s2'), '(f,15,budget_reserved)', 's2 waits for the large call');
UPDATE runrow.tenant_budget SET waiter_seen_at = now() - interval '2 minutes' WHERE fairness_key = 'fair-tenant';
SELECT pg_temp.acquire(:'s3');
SELECT is((SELECT waiter_run FROM runrow.tenant_budget WHERE fairness_key = 'fair-tenant'), :'s3'::uuid,
    'the stale waiter is forgotten, the next to wait is the waiter');

-- The total is the sum of the rows; a budget removed takes its rows with it.
SELECT is_empty($$SELECT b.fairness_key FROM runrow.tenant_budget AS b
    LEFT JOIN LATERAL (
        SELECT coalesce(sum(s.tokens), 0) AS tokens, coalesce(sum(s.cost), 0) AS cost
        FROM runrow.tenant_reservation AS s WHERE s.fairness_key = b.fairness_key
    ) AS s ON true
    WHERE (b.reserved_tokens, b.reserved_cost) IS DISTINCT FROM (s.tokens, s.cost)$$,
    'every tenant''s total is the sum of its reservations');
SELECT runrow.set_tenant_budget('cost-tenant', NULL, NULL);
SELECT is(pg_temp.held('cost-tenant'), '{}'::uuid[], 'a budget removed takes its reservations');

SELECT * FROM finish();
ROLLBACK;
