-- The claim's mark on blocked turns (migration 0021): a claim that finds a queued turn waiting
-- behind an active or earlier turn of its conversation marks it claim_blocked, so later claims
-- never read it; every way the turn ahead can end clears the mark, so the turn is claimable
-- as soon as it is next, and in turn order.
BEGIN;
\ir helpers/setup.psql
\ir helpers/row_versions.psql
\ir helpers/lifecycle.psql
\ir helpers/audit.psql
SELECT plan(47);
SELECT pg_temp.drain_queue();

SELECT has_column('runrow', 'agent_run', 'claim_blocked', 'agent_run has claim_blocked');
SELECT col_not_null('runrow', 'agent_run', 'claim_blocked', 'claim_blocked is NOT NULL');
SELECT col_default_is('runrow', 'agent_run', 'claim_blocked', 'false', 'new turns are not marked');
SELECT is(
    (SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index AS i
     WHERE i.indexrelid = 'runrow.agent_run_claimable'::regclass),
    '((status = ''queued''::text) AND (NOT claim_blocked) AND (not_before IS NULL))',
    'agent_run_claimable holds the queued turns not marked blocked (nor delayed: migration 0018)');
SELECT has_trigger('runrow', 'agent_run', 'agent_run_after_update', 'the trigger that clears the mark exists');

-- A running turn, a second queued behind it: the first claim marks it, once.
SELECT pg_temp.running() AS a1 \gset
SELECT conversation_id AS conv_a FROM runrow.agent_run WHERE id = :'a1' \gset
SELECT pg_temp.new_run(:'conv_a') AS a2 \gset
SELECT pg_temp.new_run(:'conv_a') AS a3 \gset
SELECT is((SELECT count(*)::int FROM runrow.agent_run WHERE id IN (:'a2', :'a3') AND claim_blocked), 0,
    'enqueue does not mark a turn, even behind a running one');
SELECT is_empty('SELECT * FROM runrow.claim_runs(''w'', 10)', 'a claim takes nothing of a conversation with a running turn');
SELECT results_eq(format('SELECT claim_blocked FROM runrow.agent_run WHERE id IN (%L, %L) ORDER BY enqueue_seq', :'a2', :'a3'),
    $$VALUES (true), (true)$$, 'and marks both turns waiting behind it');
SELECT is((SELECT status FROM runrow.agent_run WHERE id = :'a2'), 'queued', 'a marked turn is still queued');
SELECT pg_temp.written() AS before \gset
SELECT is_empty('SELECT * FROM runrow.claim_runs(''w'', 10)', 'the next claim takes nothing either');
SELECT is(pg_temp.written(), :'before', 'and writes nothing: marked turns are not read again');

-- The turn ahead finishes: the next one is unmarked and claimable, the one after stays marked.
SELECT ok(runrow.finish_run(:'a1', pg_temp.token(:'a1'), 'completed'), 'a1 finishes');
SELECT results_eq(format('SELECT claim_blocked FROM runrow.agent_run WHERE id IN (%L, %L) ORDER BY enqueue_seq', :'a2', :'a3'),
    $$VALUES (false), (true)$$, 'finishing a1 clears a2''s mark only');
SELECT is((SELECT run_id FROM runrow.claim_runs('w', 10)), :'a2'::uuid, 'a2 is claimed, a3 is not');

-- Every way a turn ends clears the next turn's mark. Reaped with no attempt left (failed):
SELECT pg_temp.expire(:'a2');
SELECT is((SELECT outcome FROM runrow.reap_expired_runs(0) WHERE run_id = :'a2'), 'failed', 'a2 is reaped failed');
SELECT is((SELECT claim_blocked FROM runrow.agent_run WHERE id = :'a3'), false, 'a reap that ends a2 clears a3''s mark');
SELECT is((SELECT run_id FROM runrow.claim_runs('w', 10)), :'a3'::uuid, 'a3 is claimable');

-- Requeued (attempts left): the requeued turn is claimable again, its successor stays marked.
SELECT pg_temp.running(attempts => 2) AS b1 \gset
SELECT conversation_id AS conv_b FROM runrow.agent_run WHERE id = :'b1' \gset
SELECT pg_temp.new_run(:'conv_b') AS b2 \gset
SELECT is_empty('SELECT * FROM runrow.claim_runs(''w'', 10)', 'b2 waits behind b1');
SELECT pg_temp.expire(:'b1');
SELECT is((SELECT outcome FROM runrow.reap_expired_runs(0) WHERE run_id = :'b1'), 'requeued', 'b1 is requeued');
SELECT results_eq(format('SELECT claim_blocked FROM runrow.agent_run WHERE id IN (%L, %L) ORDER BY enqueue_seq', :'b1', :'b2'),
    $$VALUES (false), (true)$$, 'the requeued b1 is not marked, b2 still is');
SELECT results_eq('SELECT run_id FROM runrow.claim_runs(''w'', 10)', format('VALUES (%L::uuid)', :'b1'),
    'a claim takes b1 again, not b2: turn order holds');
SELECT is((SELECT release_run FROM runrow.release_run(:'b1', pg_temp.token(:'b1'))), 'dead',
    'b1 released on its last attempt is dead');
SELECT is((SELECT run_id FROM runrow.claim_runs('w', 10)), :'b2'::uuid, 'which makes b2 claimable');

-- Parked on an approval, then decided: the parked turn holds the conversation, requeued it
-- is claimable first; its successor stays marked until it ends.
SELECT pg_temp.parked() AS p1 \gset
SELECT conversation_id AS conv_p FROM runrow.agent_run WHERE id = :'p1' \gset
SELECT pg_temp.new_run(:'conv_p') AS p2 \gset
SELECT is_empty('SELECT * FROM runrow.claim_runs(''w'', 10)', 'p2 waits behind the waiting p1');
SELECT is((SELECT claim_blocked FROM runrow.agent_run WHERE id = :'p2'), true, 'and is marked');
SELECT lives_ok(format('SELECT runrow.resolve_approval(%L, true, %L)', pg_temp.key_of(:'p1'), 'ops@example.com'),
    'a person approves p1''s call');
SELECT is((SELECT run_id FROM runrow.claim_runs('w', 10)), :'p1'::uuid, 'the approved p1 is claimed, not p2');
SELECT ok(runrow.finish_run(:'p1', pg_temp.token(:'p1'), 'completed'), 'p1 finishes');
SELECT is((SELECT run_id FROM runrow.claim_runs('w', 10)), :'p2'::uuid, 'then p2');

-- A queued first turn cancelled (no turn running): the marked second turn is next.
SELECT pg_temp.new_run() AS c1 \gset
SELECT conversation_id AS conv_c FROM runrow.agent_run WHERE id = :'c1' \gset
SELECT pg_temp.new_run(:'conv_c') AS c2 \gset
-- As a claim that saw c2 behind the queued c1 would have marked it.
UPDATE runrow.agent_run SET claim_blocked = true WHERE id = :'c2';
SELECT is((SELECT runrow.cancel_run(:'c1')), 'cancelled', 'c1 is cancelled while queued');
SELECT is((SELECT claim_blocked FROM runrow.agent_run WHERE id = :'c2'), false, 'which clears c2''s mark');
SELECT is((SELECT run_id FROM runrow.claim_runs('w', 10)), :'c2'::uuid, 'and c2 is claimable');

-- A stop ends the whole conversation: no marked turn is left queued.
SELECT pg_temp.running() AS s1 \gset
SELECT conversation_id AS conv_s FROM runrow.agent_run WHERE id = :'s1' \gset
SELECT pg_temp.new_run(:'conv_s') AS s2 \gset
SELECT pg_temp.new_run(:'conv_s') AS s3 \gset
SELECT is_empty('SELECT * FROM runrow.claim_runs(''w'', 10)', 's2 and s3 wait behind s1');
SELECT results_eq(format('SELECT action FROM runrow.stop_conversation(%L)', :'conv_s'),
    $$VALUES ('cancel_requested'), ('cancelled'), ('cancelled')$$, 'a stop cancels the queued turns');
SELECT is((SELECT count(*)::int FROM runrow.agent_run WHERE conversation_id = :'conv_s' AND status = 'queued'), 0,
    'no turn of the stopped conversation is left queued');

-- audit() notices a mark that outlived its reason (a turn no claim would ever take).
SELECT pg_temp.new_run() AS stuck \gset
UPDATE runrow.agent_run SET claim_blocked = true WHERE id = :'stuck';
SELECT is(pg_temp.audit_of(:'stuck'), 'claimable_turn_marked_blocked', 'audit reports a marked turn with nothing ahead');

-- At most 500 turns set aside per claim: 10,000 turns queued behind one conversation's running
-- turn were all marked by one claim (1.0 s; 50,000: 4.7 s, and past the worker's
-- statement_timeout no claim would succeed). The next claim goes on where it stopped.
SELECT pg_temp.drain_queue();
SELECT pg_temp.running() AS busy \gset
SELECT conversation_id AS conv_busy FROM runrow.agent_run WHERE id = :'busy' \gset
SELECT count(pg_temp.new_run(:'conv_busy')) FROM generate_series(1, 520);
SELECT is_empty('SELECT * FROM runrow.claim_runs(''w'', 1)', 'one tenant: nothing to claim behind a running turn');
SELECT is((SELECT count(*)::int FROM runrow.agent_run WHERE conversation_id = :'conv_busy' AND claim_blocked), 500,
    'one tenant (the batch step): the claim marked 500 of the 520 turns, no more');
SELECT is_empty('SELECT * FROM runrow.claim_runs(''w'', 1)', 'the next claim takes nothing either');
SELECT is((SELECT count(*)::int FROM runrow.agent_run WHERE conversation_id = :'conv_busy' AND claim_blocked), 520,
    'and marks the last 20');
SELECT pg_temp.drain_queue();
-- The same in the walk between tenants: another tenant's run is claimed all the same.
SELECT run_id AS hog FROM runrow.enqueue_run(gen_random_uuid(), '"x"', 'test-model', fairness_key => 'hog') \gset
SELECT pg_temp.claim(:'hog');
SELECT conversation_id AS conv_hog FROM runrow.agent_run WHERE id = :'hog' \gset
SELECT count(*) FROM (
    SELECT runrow.enqueue_run(:'conv_hog', '"x"', 'test-model', fairness_key => 'hog') FROM generate_series(1, 520)
) AS e;
SELECT run_id AS calm FROM runrow.enqueue_run(gen_random_uuid(), '"x"', 'test-model', fairness_key => 'calm') \gset
SELECT is((SELECT array_agg(run_id) FROM runrow.claim_runs('w', 2)), ARRAY[:'calm'::uuid],
    'behind 520 blocked turns of one tenant, another tenant''s run is claimed');
SELECT is((SELECT count(*)::int FROM runrow.agent_run WHERE conversation_id = :'conv_hog' AND claim_blocked), 500,
    'between tenants: 500 marked, no more');
SELECT is_empty('SELECT * FROM runrow.claim_runs(''w'', 2)', 'the next claim takes nothing');
SELECT is((SELECT count(*)::int FROM runrow.agent_run WHERE conversation_id = :'conv_hog' AND claim_blocked), 520,
    'and marks the last 20');

-- A claim stopped by the cap serves no lower priority level: priority stays strict. 600 turns
-- blocked at priority 10 with a free run behind them, a free run at priority 0: the first claim
-- took the priority-0 run.
SELECT pg_temp.drain_queue();
SELECT run_id AS hi1 FROM runrow.enqueue_run(gen_random_uuid(), '"x"', 'test-model', priority => 10) \gset
SELECT pg_temp.claim(:'hi1');
SELECT conversation_id AS conv_hi FROM runrow.agent_run WHERE id = :'hi1' \gset
SELECT count(*) FROM (
    SELECT runrow.enqueue_run(:'conv_hi', '"x"', 'test-model', priority => 10) FROM generate_series(1, 600)
) AS e;
SELECT run_id AS hi_free FROM runrow.enqueue_run(gen_random_uuid(), '"x"', 'test-model', priority => 10) \gset
SELECT run_id AS lo_free FROM runrow.enqueue_run(gen_random_uuid(), '"x"', 'test-model', fairness_key => 'low') \gset
SELECT is_empty('SELECT * FROM runrow.claim_runs(''w'', 1)',
    'capped at priority 10: the claim takes nothing of priority 0');
SELECT is((SELECT array_agg(run_id) FROM runrow.claim_runs('w', 1)), ARRAY[:'hi_free'::uuid],
    'the next claim marks the last 100 and takes the priority-10 run');
SELECT is((SELECT array_agg(run_id) FROM runrow.claim_runs('w', 1)), ARRAY[:'lo_free'::uuid],
    'then the priority-0 run');

SELECT * FROM finish();
ROLLBACK;
