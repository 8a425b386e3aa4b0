-- runrow._claim_batch_step: the claim walk's batch step, shared by the walk's fast path (a queue
-- that is one keyless group) and its serve loop. It locks up to `want` runs of one group from
-- `after` on in claim order, skips turns that wait behind another (marking them), and returns
-- the free ones; the walk takes the fast path only when nothing else could choose differently,
-- and gives what the full walk gives.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(17);
SELECT pg_temp.drain_queue();

\set sig '''{integer,text,bigint,integer}'''
SELECT has_function('runrow', '_claim_batch_step', :sig::name[], '_claim_batch_step(lvl, tenant, after, want) exists');
SELECT isnt_definer('runrow', '_claim_batch_step', :sig::name[], 'it runs as its caller');
SELECT is((SELECT proconfig FROM pg_proc WHERE oid = 'runrow._claim_batch_step(integer, text, bigint, integer)'::regprocedure),
    NULL, 'it carries no SET clauses: its callers pin the search_path and the plan settings');
SELECT is_empty($$SELECT r FROM unnest(ARRAY['runrow_worker', 'runrow_client', 'runrow_auditor']) AS r
    WHERE has_function_privilege(r, 'runrow._claim_batch_step(integer, text, bigint, integer)', 'EXECUTE')$$,
    'no runrow role may call it around the claim''s write');

-- A group of four runs of one tenant, the second waiting behind a running turn.
\set conv '''eeeeeeee-0000-0000-0000-0000000000c1'''
SELECT pg_temp.running(conv => :conv) AS ahead \gset
SELECT pg_temp.new_run() AS r1 \gset
SELECT pg_temp.new_run(:conv) AS behind \gset
SELECT pg_temp.new_run() AS r2 \gset
SELECT pg_temp.new_run() AS r3 \gset
SELECT priority AS lvl, coalesce(fairness_key, '') AS tenant, enqueue_seq AS first FROM runrow.agent_run
WHERE id = :'r1' \gset
CREATE TEMP TABLE step AS SELECT * FROM runrow._claim_batch_step(:lvl, :'tenant', :first, 3);
SELECT results_eq('SELECT ids FROM step', format($$VALUES (ARRAY[%L, %L]::uuid[])$$, :'r1', :'r2'),
    'it returns the free runs among the first three, in claim order');
SELECT results_eq('SELECT locked_count, last_seq FROM step',
    format($$SELECT 3, enqueue_seq FROM runrow.agent_run WHERE id = %L$$, :'r2'),
    'it counts the blocked turn it locked too, and says how far it read');
SELECT is((SELECT claim_blocked FROM runrow.agent_run WHERE id = :'behind'), true,
    'the turn behind a running one is marked, so later claims pass it by');
SELECT results_eq('SELECT since FROM step',
    format($$SELECT ARRAY[(SELECT updated_at FROM runrow.agent_run WHERE id = %L),
                          (SELECT updated_at FROM runrow.agent_run WHERE id = %L)]$$, :'r1', :'r2'),
    'with when each free run became claimable');
SELECT is((SELECT xmax::text FROM runrow.agent_run WHERE id = :'r3'), '0', 'r3, past want, is not locked');

-- The walk's fast path: one keyless group, no delayed run due, no fleet limit set.
SET LOCAL track_functions = 'pl';
CREATE FUNCTION pg_temp.steps() RETURNS bigint LANGUAGE sql AS $$
    SELECT coalesce(pg_stat_get_xact_function_calls(
        'runrow._claim_batch_step(integer, text, bigint, integer)'::regprocedure), 0)
$$;
CREATE FUNCTION pg_temp.group_with_a_waiting_turn(OUT r1 uuid, OUT r2 uuid) LANGUAGE plpgsql AS $$
DECLARE conv uuid := gen_random_uuid();
BEGIN
    PERFORM pg_temp.drain_queue();
    PERFORM pg_temp.running(conv => conv);
    r1 := pg_temp.new_run();
    PERFORM pg_temp.new_run(conv);
    r2 := pg_temp.new_run();
    PERFORM pg_temp.new_run();
END $$;
SELECT r1, r2 FROM pg_temp.group_with_a_waiting_turn() \gset
SELECT pg_temp.steps() AS steps \gset
SELECT pg_stat_get_xact_numscans('runrow.agent_run_claimable'::regclass) AS scans \gset
SELECT is((SELECT locked FROM runrow._claim_walk('w', 2, 30)), ARRAY[:'r1', :'r2']::uuid[],
    'one keyless group: max_runs runs locked in claim order, past the turn that waits');
-- The walk reads agent_run_claimable six times for this: its head, the next tenant, the next
-- key, a batch step, the group's next head past the blocked turn, a second batch step.
SELECT is(
    (pg_temp.steps() - :steps) || ' ' || (pg_stat_get_xact_numscans('runrow.agent_run_claimable'::regclass) - :scans),
    '2 4', 'by the fast path: the index''s first and last entries, then a batch step, and a second '
    'past the blocked turn''s slot: four reads of agent_run_claimable, not the walk''s six');

-- Any blocked rate-limit key (here another model's) sends the claim down the walk, run by run,
-- to the same runs.
SELECT runrow.set_rate_limit('some-other-model', 60, NULL, NULL);
UPDATE runrow.rate_limit SET blocked_until = now() + interval '1 hour' WHERE rate_limit_key = 'some-other-model';
SELECT r1, r2 FROM pg_temp.group_with_a_waiting_turn() \gset
SELECT pg_temp.steps() AS steps \gset
SELECT is((SELECT locked FROM runrow._claim_walk('w', 2, 30)), ARRAY[:'r1', :'r2']::uuid[],
    'the full walk locks the same runs');
SELECT is(pg_temp.steps() - :steps, 0::bigint, 'without a batch step: the walk''s per-candidate path');
UPDATE runrow.rate_limit SET blocked_until = NULL WHERE rate_limit_key = 'some-other-model';

-- Two tenants: the walk decides, fairly.
SELECT r1, r2 FROM pg_temp.group_with_a_waiting_turn() \gset
SELECT run_id AS other_tenant FROM runrow.enqueue_run(
    conversation_id => gen_random_uuid(), content => '"hi"', model => 'test-model', fairness_key => 'tenant-b') \gset
SELECT pg_temp.steps() AS steps \gset
SELECT is((SELECT locked FROM runrow._claim_walk('w', 2, 30)), ARRAY[:'r1', :'other_tenant']::uuid[],
    'two tenants: one run of each, as fair claiming orders them');
SELECT is(pg_temp.steps() - :steps, 0::bigint, 'by the walk, not the fast path');

-- An empty queue: nothing locked, no batch step, and the fast path's look ends the claim (the
-- walk would read the index's head again).
SELECT pg_temp.drain_queue();
SELECT pg_temp.steps() AS steps \gset
SELECT pg_stat_get_xact_numscans('runrow.agent_run_claimable'::regclass) AS scans \gset
SELECT is((SELECT cardinality(locked) FROM runrow._claim_walk('w', 10, 30)), 0, 'an empty queue: nothing locked');
SELECT is(
    (pg_temp.steps() - :steps) || ' ' || (pg_stat_get_xact_numscans('runrow.agent_run_claimable'::regclass) - :scans),
    '0 1', 'no batch step, and one read of agent_run_claimable: the look, not the walk after it');
RESET track_functions;

SELECT * FROM finish();
ROLLBACK;
