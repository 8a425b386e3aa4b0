-- runrow.claim_runs: several runs in one call, across conversations, never two turns of
-- one conversation, in enqueue order; max_runs bounds; nothing claimable writes nothing.
BEGIN;
\ir helpers/setup.psql
\ir helpers/row_versions.psql
SELECT plan(38);
SELECT pg_temp.drain_queue();

\set sig '''{text,integer,integer}'''
SELECT has_function('runrow', 'claim_runs', :sig::name[], 'claim_runs(worker_id, max_runs, lease_seconds) exists');
SELECT is_definer('runrow', 'claim_runs', :sig::name[], 'claim_runs is SECURITY DEFINER');
SELECT function_privs_are('runrow', 'claim_runs', :sig::name[], 'runrow_worker', ARRAY['EXECUTE'],
    'runrow_worker may claim');
SELECT function_privs_are('runrow', 'claim_runs', :sig::name[], 'runrow_client', ARRAY[]::name[],
    'runrow_client may not claim');
SELECT function_privs_are('runrow', 'claim_runs', :sig::name[], 'public', ARRAY[]::name[],
    'PUBLIC may not claim');

-- Nothing claimable: no row, nothing written.
SELECT pg_temp.written() AS before \gset
SELECT is_empty('SELECT * FROM runrow.claim_runs(''w'', 10)', 'an empty queue claims nothing');
SELECT is(pg_temp.written(), :'before', 'and writes nothing');

-- Turns, in enqueue order: a1 b1 a2 c1 c2 d1 (a, c have two turns each).
\set ca '''cccccccc-0000-0000-0000-00000000000a'''
\set cb '''cccccccc-0000-0000-0000-00000000000b'''
\set cc '''cccccccc-0000-0000-0000-00000000000c'''
\set cd '''cccccccc-0000-0000-0000-00000000000d'''
SELECT pg_temp.new_run(:ca) AS a1 \gset
SELECT run_id AS b1 FROM runrow.enqueue_run(:cb, '"b1"', 'model-b', user_id => 'ub', system_prompt => 'sys-b',
    tools => '[{"name": "t", "input_schema": {"type": "object"}}]', max_attempts => 2, metadata => '{"k": "v"}') \gset
SELECT pg_temp.new_run(:ca) AS a2 \gset
SELECT pg_temp.new_run(:cc) AS c1 \gset
SELECT pg_temp.new_run(:cc) AS c2 \gset
SELECT pg_temp.new_run(:cd) AS d1 \gset

SET LOCAL ROLE runrow_worker;
CREATE TEMP TABLE k1 AS
SELECT row_number() OVER () AS n, * FROM runrow.claim_runs(worker_id => 'w1', max_runs => 3, lease_seconds => 20);
RESET ROLE;
SELECT results_eq('SELECT run_id FROM k1 ORDER BY n',
    format('VALUES (%L::uuid), (%L::uuid), (%L::uuid)', :'a1', :'b1', :'c1'),
    'max_runs 3 claims the three oldest claimable turns, one per conversation, in enqueue order');
SELECT is((SELECT count(DISTINCT claim_token)::int FROM k1), 3, 'each claim gets its own token');
SELECT is(
    (SELECT count(*)::int FROM k1 JOIN runrow.agent_run AS a ON a.id = k1.run_id
     WHERE a.status = 'running' AND a.worker_id = 'w1' AND a.claim_token = k1.claim_token
       AND a.claim_expires_at = now() + interval '20 seconds' AND k1.claim_expires_at = a.claim_expires_at
       AND a.last_heartbeat_at = now() AND a.started_at = now() AND a.attempt = 1 AND k1.attempt = 1),
    3, 'each claimed row is running with its token, the worker, a lease on the database clock, attempt 1');
SELECT is(
    (SELECT (k1.conversation_id, k1.max_attempts, k1.model, k1.system_prompt, k1.tools, k1.user_id,
             k1.metadata, k1.prompt_id = a.prompt_id, k1.user_message_id = a.user_message_id)::text
     FROM k1 JOIN runrow.agent_run AS a ON a.id = k1.run_id WHERE k1.run_id = :'b1'),
    (SELECT (:cb::uuid, 2, 'model-b', 'sys-b', '[{"name": "t", "input_schema": {"type": "object"}}]'::jsonb, 'ub', '{"k": "v"}'::jsonb, true, true)::text),
    'a claim returns the pinned model, prompt, tools, user, message and metadata');
SELECT results_eq(
    format('SELECT e.seq, e.type, CASE WHEN e.seq = 3 THEN e.payload END FROM runrow.run_event AS e
            WHERE e.run_id = %L ORDER BY e.seq', :'b1'),
    $$VALUES (1::bigint, 'user_message_created'::text, NULL::jsonb), (2, 'run_queued', NULL),
             (3, 'run_claimed', '{"type": "run_claimed", "worker_id": "w1", "attempt": 1}'::jsonb)$$,
    'run_claimed is journaled at seq 3 with the worker and attempt');
SELECT is(
    (SELECT count(*)::int FROM runrow.run_event AS e JOIN k1 ON k1.run_id = e.run_id
     WHERE e.seq = 3 AND e.type = 'run_claimed'),
    3, 'every claimed run journals run_claimed');
SELECT is(
    (SELECT array_agg(a.status ORDER BY a.enqueue_seq) FROM runrow.agent_run AS a
     WHERE a.id IN (:'a2', :'c2', :'d1')),
    ARRAY['queued', 'queued', 'queued'], 'turns beyond max_runs or behind a running turn stay queued');

-- A conversation with a running turn gives no second one, however many slots are free.
CREATE TEMP TABLE k2 AS SELECT * FROM runrow.claim_runs('w2', 10);
SELECT results_eq('SELECT run_id FROM k2', format('VALUES (%L::uuid)', :'d1'),
    'the next call with 10 slots claims only the turn of a free conversation');
SELECT pg_temp.written() AS before \gset
SELECT is_empty('SELECT * FROM runrow.claim_runs(''w3'', 10)', 'second turns of busy conversations are not claimed');
SELECT is(pg_temp.written(), :'before', 'a claim that finds nothing writes nothing');

-- Turns of one idle conversation: only the oldest, whatever max_runs is.
\set ce '''cccccccc-0000-0000-0000-00000000000e'''
SELECT pg_temp.new_run(:ce) AS e1 \gset
SELECT pg_temp.new_run(:ce) AS e2 \gset
SELECT pg_temp.new_run(:ce) AS e3 \gset
SELECT results_eq('SELECT run_id FROM runrow.claim_runs(''w4'', 1000)', format('VALUES (%L::uuid)', :'e1'),
    'three queued turns of one conversation: only the first is claimed');

-- Ending a turn makes exactly the next turn of that conversation claimable.
SELECT ok(runrow.finish_run(:'a1', (SELECT claim_token FROM k1 WHERE run_id = :'a1'), 'completed'), 'a1 finishes');
SELECT ok(runrow.finish_run(:'c1', (SELECT claim_token FROM k1 WHERE run_id = :'c1'), 'failed'), 'c1 fails');
SELECT results_eq('SELECT run_id FROM runrow.claim_runs(''w5'', 10)',
    format('VALUES (%L::uuid), (%L::uuid)', :'a2', :'c2'),
    'after the first turns end, the second turns are claimed together, in enqueue order');
SELECT is(
    (SELECT array_agg(a.status ORDER BY a.enqueue_seq) FROM runrow.agent_run AS a WHERE a.id IN (:'a1', :'c1')),
    ARRAY['completed', 'failed'], 'ended runs are never claimed again');

-- max_runs = 1 takes exactly one of several claimable runs, the oldest.
SELECT pg_temp.new_run() AS f1 \gset
SELECT pg_temp.new_run() AS g1 \gset
SELECT results_eq('SELECT run_id FROM runrow.claim_runs(''w6'', 1)', format('VALUES (%L::uuid)', :'f1'),
    'max_runs 1 claims only the oldest');
SELECT is((SELECT a.status FROM runrow.agent_run AS a WHERE a.id = :'g1'), 'queued', 'the other stays queued');

-- The default worker id names the backend; the default lease is 30 s.
CREATE TEMP TABLE k3 AS SELECT * FROM runrow.claim_runs();
SELECT is(
    (SELECT (a.worker_id, a.claim_expires_at)::text FROM runrow.agent_run AS a WHERE a.id = :'g1'),
    (SELECT ('anonymous-' || pg_backend_pid(), now() + interval '30 seconds')::text),
    'defaults: worker_id anonymous-<backend pid>, a 30 s lease');

-- A reaped run with attempts left is claimable again, with a new token and attempt 2.
SELECT k1.claim_token AS b1tok FROM k1 WHERE k1.run_id = :'b1' \gset
SELECT pg_temp.expire(:'b1');
SELECT is((SELECT outcome FROM runrow.reap_expired_runs(0) WHERE run_id = :'b1'), 'requeued', 'b1 is reaped');
CREATE TEMP TABLE k4 AS SELECT * FROM runrow.claim_runs('w7', 10);
SELECT is((SELECT (run_id, attempt, claim_token <> :'b1tok')::text FROM k4),
    (SELECT (:'b1'::uuid, 2, true)::text), 'the requeued run is claimed again: attempt 2, a fresh token');

-- Bad input: each argument, nothing written.
SELECT pg_temp.new_run() AS h1 \gset
SELECT pg_temp.written() AS before \gset
SELECT throws_ok('SELECT * FROM runrow.claim_runs(''w'', 0)', '22023',
    'max_runs must be between 1 and 1000, got 0', 'max_runs 0');
SELECT throws_ok('SELECT * FROM runrow.claim_runs(''w'', 1001)', '22023',
    'max_runs must be between 1 and 1000, got 1001', 'max_runs 1001');
SELECT throws_ok('SELECT * FROM runrow.claim_runs(''w'', NULL)', '22004', 'max_runs must not be NULL', 'max_runs NULL');
SELECT throws_ok('SELECT * FROM runrow.claim_runs(''w'', 10, 0)', '22023',
    'lease_seconds must be between 1 and 3600, got 0', 'lease_seconds 0');
SELECT throws_ok('SELECT * FROM runrow.claim_runs(''w'', 10, 3601)', '22023',
    'lease_seconds must be between 1 and 3600, got 3601', 'lease_seconds 3601');
SELECT throws_ok('SELECT * FROM runrow.claim_runs(''w'', 10, NULL)', '22004',
    'lease_seconds must not be NULL', 'lease_seconds NULL');
SELECT throws_ok('SELECT * FROM runrow.claim_runs('''', 10)', '22023',
    'worker_id must be NULL or 1 to 200 characters', 'worker_id empty');
SELECT throws_ok('SELECT * FROM runrow.claim_runs(repeat(''w'', 201), 10)', '22023',
    'worker_id must be NULL or 1 to 200 characters', 'worker_id of 201 characters');
SELECT is(pg_temp.written(), :'before', 'bad input wrote nothing');
SELECT is((SELECT a.status FROM runrow.agent_run AS a WHERE a.id = :'h1'), 'queued', 'the queued run is still queued');
SELECT results_eq(
    format('SELECT run_id FROM runrow.claim_runs(repeat(%L, 200), 1000, 3600)', 'w'),
    format('VALUES (%L::uuid)', :'h1'), 'the upper bounds (200-char worker, 1000 runs, 3600 s) are accepted');

SELECT * FROM finish();
ROLLBACK;
