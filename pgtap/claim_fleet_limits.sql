-- The claim's fleet-limit checks (issue 13): a run whose rate-limit key is blocked is not
-- claimed (it waits out the block as a delayed run); a run of a tenant over its daily budget
-- is not started: it ends failed budget_exhausted at claim, journaled. Other runs are claimed.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(22);
-- Counted from the start (test 12): PL/pgSQL compiles a simple expression, a helper's call in
-- an assignment among them, once per transaction, with the call counting in force then.
SET LOCAL track_functions = 'pl';
SELECT pg_temp.drain_queue();

CREATE FUNCTION pg_temp.fleet_queued(key text DEFAULT NULL, tenant text DEFAULT NULL) RETURNS uuid
LANGUAGE sql AS $$
    SELECT e.run_id FROM runrow.enqueue_run(
        conversation_id => gen_random_uuid(), content => '"hi"', model => 'test-model', user_id => tenant,
        rate_limit_key => key) AS e
$$;

-- A blocked key: reported by a running run of the key.
SELECT pg_temp.fleet_queued('hot') AS reporter \gset
SELECT pg_temp.claim(:'reporter');
SELECT runrow.report_rate_limited(:'reporter', pg_temp.token(:'reporter'), 60);
SELECT pg_temp.fleet_queued('hot') AS blocked \gset
SELECT pg_temp.fleet_queued('cold') AS free \gset

SELECT is((SELECT array_agg(run_id) FROM runrow.claim_runs('pgtap', 10, 30)), ARRAY[:'free'::uuid],
    'the claim skips the run whose key is blocked and takes the other');
SELECT is((SELECT (status, not_before = now() + interval '60 seconds')::text FROM runrow.agent_run WHERE id = :'blocked'),
    '(queued,t)', 'the blocked run waits out the block as a delayed run');
SELECT is((SELECT count(*)::int FROM runrow.runs_in_backoff WHERE run_id = :'blocked'), 1,
    'runs_in_backoff shows it');
SELECT is_empty($$SELECT * FROM runrow.claim_runs('pgtap', 10, 30)$$, 'while the block lasts no claim takes it');
UPDATE runrow.rate_limit SET blocked_until = now() - interval '1 second' WHERE rate_limit_key = 'hot';
UPDATE runrow.agent_run SET not_before = now() - interval '1 second' WHERE id = :'blocked';
SELECT is((SELECT array_agg(run_id) FROM runrow.claim_runs('pgtap', 10, 30)), ARRAY[:'blocked'::uuid],
    'once the block is over the run is claimed');

-- A tenant over its daily budget.
SELECT runrow.set_tenant_budget('spender', 100, NULL);
SELECT pg_temp.fleet_queued(tenant => 'spender') AS spent_run \gset
SELECT pg_temp.claim(:'spent_run');
SELECT runrow.append_step(:'spent_run', pg_temp.token(:'spent_run'), 'model_turn', '[{"type": "text", "text": "x"}]',
    NULL, '{"input_tokens": 150}', 'end_turn');
SELECT pg_temp.fleet_queued(tenant => 'spender') AS over \gset
SELECT pg_temp.fleet_queued(tenant => 'thrifty') AS other \gset
SELECT is((SELECT array_agg(run_id) FROM runrow.claim_runs('pgtap', 10, 30)), ARRAY[:'other'::uuid],
    'the claim does not start the run of the tenant over budget');
SELECT is((SELECT (status, error, finished_at IS NOT NULL, attempt)::text FROM runrow.agent_run WHERE id = :'over'),
    '(failed,"budget_exhausted: tenant ""spender"" used 150 tokens of its 100 per day",t,0)',
    'it ended failed budget_exhausted at claim, nothing silently held');
SELECT is(pg_temp.journal(:'over'), ARRAY['user_message_created', 'run_queued', 'budget_exhausted', 'complete'],
    'the journal says so');
SELECT is(pg_temp.last_event(:'over') ->> 'status', 'failed', 'its complete event says failed');
SELECT is_empty(format($$SELECT * FROM runrow.audit() WHERE run_id = %L$$, :'over'), 'audit finds nothing wrong with it');

-- One verdict per tenant per claim, however many of its runs the claim ends.
SELECT pg_temp.fleet_queued(tenant => 'spender') AS over2 \gset
SELECT pg_temp.fleet_queued(tenant => 'spender') AS over3 \gset
SELECT pg_temp.fleet_queued(tenant => 'spender') AS over4 \gset
SELECT coalesce(pg_stat_get_xact_function_calls('runrow._tenant_verdict(text)'::regprocedure), 0) AS verdicts \gset
SELECT is_empty($$SELECT * FROM runrow.claim_runs('pgtap', 10, 30)$$, 'three more runs of the tenant: none started');
SELECT is(
    (SELECT array_agg(status ORDER BY id)::text || ' ' ||
            (coalesce(pg_stat_get_xact_function_calls('runrow._tenant_verdict(text)'::regprocedure), 0) - :verdicts)
     FROM runrow.agent_run WHERE id IN (:'over2', :'over3', :'over4')),
    '{failed,failed,failed} 1',
    'all three end budget_exhausted on one verdict of the tenant''s budget');
RESET track_functions;

-- At most 500 runs of tenants over budget end in one claim: 20,000 queued runs of one tenant
-- all ended in one claim (3.3 s in one transaction); the rest end in later claims.
SELECT count(pg_temp.fleet_queued(tenant => 'spender')) FROM generate_series(1, 520);
SELECT pg_temp.fleet_queued(tenant => 'thrifty') AS after_many \gset
SELECT is((SELECT array_agg(run_id) FROM runrow.claim_runs('pgtap', 10, 30)), ARRAY[:'after_many'::uuid],
    'behind 520 runs of a tenant over budget, another tenant''s run is claimed');
SELECT is((SELECT count(*)::int FROM runrow.agent_run WHERE fairness_key = 'spender' AND status = 'queued'), 20,
    'the claim ended 500 of them, no more');
SELECT is_empty($$SELECT * FROM runrow.claim_runs('pgtap', 10, 30)$$, 'the next claim starts none of them');
SELECT is((SELECT count(*)::int FROM runrow.agent_run WHERE fairness_key = 'spender' AND status = 'queued'), 0,
    'and ends the last 20');

-- At most 500 runs delayed for a blocked key per claim: 10,000 runs of a key just refused with
-- a 429 were all delayed by one claim (0.95 s); the next claim delays the rest.
SELECT pg_temp.fleet_queued('flood') AS flooder \gset
SELECT pg_temp.claim(:'flooder');
SELECT runrow.report_rate_limited(:'flooder', pg_temp.token(:'flooder'), 60);
SELECT count(pg_temp.fleet_queued('flood', 'hog')) FROM generate_series(1, 520);
SELECT pg_temp.fleet_queued('calm', 'other') AS calm \gset
SELECT is((SELECT array_agg(run_id) FROM runrow.claim_runs('pgtap', 10, 30)), ARRAY[:'calm'::uuid],
    'behind 520 runs of a blocked key, another tenant''s run is claimed');
SELECT is((SELECT count(*)::int FROM runrow.agent_run
           WHERE rate_limit_key = 'flood' AND status = 'queued' AND not_before IS NOT NULL), 500,
    'the claim delayed 500 of them, no more');
SELECT is_empty($$SELECT * FROM runrow.claim_runs('pgtap', 10, 30)$$, 'the next claim starts none of them');
SELECT is((SELECT count(*)::int FROM runrow.agent_run
           WHERE rate_limit_key = 'flood' AND status = 'queued' AND not_before IS NOT NULL), 520,
    'and delays the last 20');
SELECT runrow.finish_run(:'flooder', pg_temp.token(:'flooder'), 'completed');
UPDATE runrow.rate_limit SET blocked_until = now() - interval '1 second' WHERE rate_limit_key = 'flood';
UPDATE runrow.agent_run SET status = 'cancelled', finished_at = now() WHERE rate_limit_key = 'flood' AND status = 'queued';

-- Without blocks or budgets the claim is as before.
SELECT runrow.set_tenant_budget('spender', NULL, NULL);
SELECT pg_temp.fleet_queued(tenant => 'spender') AS again \gset
SELECT is((SELECT array_agg(run_id) FROM runrow.claim_runs('pgtap', 10, 30)), ARRAY[:'again'::uuid],
    'the budget removed, the tenant''s runs are claimed again');
SELECT is((SELECT count(*)::int FROM runrow.tenants_over_budget), 0, 'no tenant is over budget');

SELECT * FROM finish();
ROLLBACK;
