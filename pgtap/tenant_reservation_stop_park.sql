-- A claim that a stop (_end_stopped) or a park on a person (_park_for_person) ends with a call
-- granted and unsettled takes the call's reservation out of its tenant's total then (migration
-- 0097), as finish_run does. Before, the row stayed until a grant that had to wait pruned it, so
-- the tenant's calls were held back by a run that no longer ran (for as long as a person took to
-- decide), and a parked run's grant stayed on its row: the claim after the decision has the same
-- attempt number, and a reap of it charged the earlier claim's grant. Nothing is charged at the
-- stop or the park (the holder is alive); a stop the worker ends itself settles and finishes as
-- before, counted once.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/audit.psql
SELECT plan(16);
SELECT pg_temp.drain_queue();

SELECT runrow.set_model_price('sp-model', 3, 15, 3.75, 0.3);
SELECT runrow.set_tenant_budget('sp-tenant', 100000, NULL);

-- A run of the tenant claimed, granted a call (300 + 1000 reserved, 1300 tokens) and with a
-- model turn calling one tool stored without its usage: the grant is still unsettled.
CREATE FUNCTION pg_temp.granted_run() RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE run uuid;
BEGIN
    SELECT e.run_id INTO run FROM runrow.enqueue_run(
        conversation_id => gen_random_uuid(), content => '"hi"', model => 'sp-model', user_id => 'sp-tenant',
        metadata => '{"max_tokens": 1000}', max_attempts => 3, tools => pg_temp.tools_offered()) AS e;
    PERFORM pg_temp.claim(run);
    IF NOT (SELECT a.granted FROM runrow.acquire_model_call(run, pg_temp.token(run), 300) AS a) THEN
        RAISE EXCEPTION 'pg_temp.granted_run: the call was not granted';
    END IF;
    RETURN run;
END $$;
CREATE FUNCTION pg_temp.reserved() RETURNS text LANGUAGE sql AS $$
    SELECT (reserved_tokens, reserved_cost::numeric(12, 6))::text FROM runrow.tenant_budget WHERE fairness_key = 'sp-tenant'
$$;
CREATE FUNCTION pg_temp.rows_of(run uuid) RETURNS int LANGUAGE sql AS $$
    SELECT count(*)::int FROM runrow.tenant_reservation WHERE run_id = run
$$;
CREATE FUNCTION pg_temp.spent(run uuid) RETURNS bigint LANGUAGE sql AS $$
    SELECT spent_tokens FROM runrow.agent_run WHERE id = run
$$;

-- A park on a person.
SELECT pg_temp.granted_run() AS p \gset
SELECT is(pg_temp.reserved(), '(1300,0.015900)', 'the grant is counted');
SELECT is(pg_temp.begin(:'p', pg_temp.tool_turn(:'p', 'tu_p'), 'irreversible'), 'needs_approval', 'the run parks');
SELECT is(pg_temp.status(:'p'), 'waiting', 'waiting on a person');
SELECT is(pg_temp.rows_of(:'p'), 0, 'the parked claim''s reservation row is gone');
SELECT is(pg_temp.reserved(), '(0,0.000000)', 'the tenant''s total no longer counts it');
SELECT is((SELECT model_call_reserved FROM runrow.agent_run WHERE id = :'p'), NULL, 'nor does the run');
-- Approved, claimed again (the same attempt number), and its new holder dies before any call:
-- the reap charges nothing of the earlier claim's grant.
SELECT runrow.resolve_approval(pg_temp.key_of(:'p'), true, 'alice');
SELECT pg_temp.claim(:'p');
SELECT pg_temp.expire(:'p');
SELECT is((SELECT count(*)::int FROM runrow.reap_expired_runs(60) AS x WHERE x.run_id = :'p'), 1, 'reaped');
SELECT is(pg_temp.spent(:'p'), 0::bigint, 'nothing charged for a grant its live holder was done with');
SELECT runrow.cancel_run(:'p');  -- requeued: out of the next claims' way

-- A stop that ends the claim before a tool call starts (_end_stopped).
SELECT pg_temp.granted_run() AS s \gset
SELECT pg_temp.tool_turn(:'s', 'tu_s') AS s_key \gset
SELECT is(runrow.cancel_run(:'s'), 'cancel_requested', 'a stop is requested while it runs');
SELECT is(pg_temp.reserved(), '(1300,0.015900)', 'a stop requested leaves the grant to its holder');
SELECT is(pg_temp.begin(:'s', :'s_key', 'non_idempotent'), NULL, 'the call does not start');
SELECT is(pg_temp.status(:'s'), 'cancelled', 'the run ends cancelled');
SELECT is(pg_temp.rows_of(:'s'), 0, 'the stopped claim''s reservation row is gone');
SELECT is(pg_temp.spent(:'s'), 0::bigint, 'nothing charged at the stop');

-- A stop the worker ends itself: it settles what it was billed, then finishes; counted once.
SELECT pg_temp.granted_run() AS w \gset
SELECT runrow.cancel_run(:'w');
SELECT runrow.record_usage(:'w', pg_temp.token(:'w'), '{"input_tokens": 200, "output_tokens": 50}');
SELECT runrow.finish_run(:'w', pg_temp.token(:'w'), 'cancelled');
SELECT is((pg_temp.spent(:'w'), pg_temp.rows_of(:'w'))::text, '(250,0)', 'the settle charged once, no row left');
SELECT is(pg_temp.reserved(), '(0,0.000000)', 'the tenant''s total is empty');

SELECT * FROM finish();
ROLLBACK;
