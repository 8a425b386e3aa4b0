-- runrow.resolve_approval and runrow.pending_approvals: who decided, requeue with wake
-- and journal, deciding twice, stopped runs, the client's view, bad input.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/row_versions.psql
\ir helpers/steps.psql
SELECT plan(36);
SELECT pg_temp.drain_queue();

\set sig '''{text,boolean,text,text}'''
SELECT has_function('runrow', 'resolve_approval', :sig::name[], 'resolve_approval(idempotency_key, approved, decided_by, note) exists');
SELECT is_definer('runrow', 'resolve_approval', :sig::name[], 'resolve_approval is SECURITY DEFINER');
SELECT function_privs_are('runrow', 'resolve_approval', :sig::name[], 'runrow_client', ARRAY['EXECUTE'], 'the client decides');
SELECT function_privs_are('runrow', 'resolve_approval', :sig::name[], 'runrow_worker', ARRAY[]::name[], 'the worker may not');
SELECT function_privs_are('runrow', 'resolve_approval', :sig::name[], 'public', ARRAY[]::name[], 'PUBLIC may not');
SELECT table_privs_are('runrow', 'pending_approvals', 'runrow_client', ARRAY['SELECT'], 'the client reads pending_approvals');
SELECT table_privs_are('runrow', 'tool_effect', 'runrow_client', ARRAY[]::text[], 'but not the tables behind it');

-- A call waiting for approval.
SELECT pg_temp.running(attempts => 2) AS r \gset
SELECT pg_temp.tool_turn(:'r', 'tu_1', 'send_wire', '{"eur": 100}') AS s1 \gset
SELECT pg_temp.key(:'r', :s1, 'tu_1', 'send_wire', '{"eur": 100}') AS k1 \gset
SELECT pg_temp.begin(:'r', pg_temp.token(:'r'), :'k1', 'send_wire', '{"eur": 100}', 'irreversible');
SELECT is((SELECT count(*)::int FROM runrow.pending_approvals), 1, 'one call waits on a person');

-- Approve, as the client role.
SET LOCAL ROLE runrow_client;
SELECT is((SELECT (reason, tool, args, effect, tool_use_id)::text FROM runrow.pending_approvals WHERE idempotency_key = :'k1'),
    '(needs_approval,send_wire,"{""eur"": 100}",irreversible,tu_1)', 'the client sees what it is asked to approve');
SELECT is(runrow.resolve_approval(:'k1', true, 'alice', 'ok, once'), :'r'::uuid, 'returns the run it requeued');
RESET ROLE;
SELECT is((SELECT (state, approved, decided_by, decision_note, decided_at = now())::text FROM runrow.tool_effect
           WHERE idempotency_key = :'k1'), '(approved,t,alice,"ok, once",t)', 'records who decided, what, why and when');
SELECT is((SELECT (status, claim_token IS NULL)::text FROM runrow.agent_run WHERE id = :'r'), '(queued,t)', 'the run is queued again');
SELECT is((SELECT array_agg(type ORDER BY seq) FROM (SELECT type, seq FROM runrow.run_event WHERE run_id = :'r' ORDER BY seq DESC LIMIT 2) AS x),
    ARRAY['approval_resolved', 'run_requeued'],
    'approval_resolved and run_requeued are journaled');
SELECT is((SELECT payload - 'type' FROM runrow.run_event WHERE run_id = :'r' AND type = 'approval_resolved'),
    jsonb_build_object('idempotency_key', :'k1', 'reason', 'needs_approval', 'tool', 'send_wire', 'approved', true,
        'decided_by', 'alice', 'note', 'ok, once'), 'the journal names the call and the decision');
SELECT is((SELECT count(*)::int FROM runrow.pending_approvals), 0, 'nothing is pending any more');
SELECT is((SELECT run_id FROM runrow.claim_run('w')), :'r'::uuid, 'a worker claims the requeued run');

-- Deciding twice: an error naming the first decision, nothing written.
SELECT pg_temp.steps_written() AS before \gset
SELECT throws_ok(format('SELECT runrow.resolve_approval(%L, false, ''bob'')', :'k1'), '55000',
    format('idempotency_key %s is not waiting for a decision: it is approved (decided by alice at %s)', :'k1', now()),
    'a second decision is refused and names the first');
SELECT is(pg_temp.steps_written(), :'before', 'and writes nothing');

-- A run stopped while it waited: nothing left to decide.
SELECT pg_temp.running() AS r2 \gset
SELECT pg_temp.tool_turn(:'r2', 'tu_2', 'delete_user', '{"id": 7}') AS s2 \gset
SELECT pg_temp.key(:'r2', :s2, 'tu_2', 'delete_user', '{"id": 7}') AS k2 \gset
SELECT pg_temp.begin(:'r2', pg_temp.token(:'r2'), :'k2', 'delete_user', '{"id": 7}', 'irreversible');
SELECT is(runrow.cancel_run(:'r2'), 'cancelled', 'a waiting run is cancelled outright by a stop');
SELECT is((SELECT count(*)::int FROM runrow.pending_approvals WHERE idempotency_key = :'k2'), 0,
    'its call is no longer listed');
SELECT pg_temp.steps_written() AS before \gset
SELECT throws_ok(format('SELECT runrow.resolve_approval(%L, true, ''bob'')', :'k2'), '55000',
    format('idempotency_key %s: its run %s is cancelled, not waiting for a decision', :'k2', :'r2'),
    'deciding a call of a stopped run is refused');
SELECT is(pg_temp.steps_written(), :'before', 'and writes nothing');

-- Rejection requeues too.
SELECT pg_temp.running() AS r3 \gset
SELECT pg_temp.tool_turn(:'r3', 'tu_3', 'rm', '{}') AS s3 \gset
SELECT pg_temp.key(:'r3', :s3, 'tu_3', 'rm', '{}') AS k3 \gset
SELECT pg_temp.begin(:'r3', pg_temp.token(:'r3'), :'k3', 'rm', '{}', 'irreversible');
SELECT is(runrow.resolve_approval(:'k3', false, 'carol'), :'r3'::uuid, 'a rejection');
SELECT is((SELECT (state, approved, decision_note IS NULL)::text FROM runrow.tool_effect WHERE idempotency_key = :'k3'),
    '(rejected,f,t)', 'is recorded (the note is optional)');
SELECT is(pg_temp.status(:'r3'), 'queued', 'and requeues the run, so its worker can tell the model');

-- Bad input per argument.
SELECT pg_temp.steps_written() AS before \gset
SELECT throws_ok('SELECT runrow.resolve_approval(NULL, true, ''x'')', '22004', 'idempotency_key must not be NULL', 'idempotency_key NULL');
SELECT throws_ok(format('SELECT runrow.resolve_approval(%L, NULL, ''x'')', :'k3'), '22004', 'approved must not be NULL', 'approved NULL');
SELECT throws_ok(format('SELECT runrow.resolve_approval(%L, true, NULL)', :'k3'), '22004', 'decided_by must not be NULL', 'decided_by NULL');
SELECT throws_ok(format('SELECT runrow.resolve_approval(%L, true, '''')', :'k3'), '22023',
    'decided_by must name the person deciding in 1 to 200 characters, not only white space', 'an empty decided_by');
SELECT throws_ok(format('SELECT runrow.resolve_approval(%L, true, %L)', :'k3', E' \t '), '22023',
    'decided_by must name the person deciding in 1 to 200 characters, not only white space',
    'a decided_by of white space names nobody');
SELECT throws_ok(format('SELECT runrow.resolve_approval(%L, true, %L)', :'k3', E'\u00a0'), '22023',
    'decided_by must name the person deciding in 1 to 200 characters, not only white space',
    'nor does a no-break space (the SQL audit: it approved an irreversible call)');
SELECT throws_ok(format('SELECT runrow.resolve_approval(%L, true, %L)', :'k3', E'\u3000\u2028'), '22023',
    'decided_by must name the person deciding in 1 to 200 characters, not only white space',
    'nor any other Unicode white space');
SELECT throws_ok(format('SELECT runrow.resolve_approval(%L, false, ''x'', '''')', :'k3'), '22023',
    'note must be NULL (no note) or text, not empty', 'an empty note (the contract said so; it was stored)');
SELECT throws_ok(format('SELECT runrow.resolve_approval(%L, true, ''x'', repeat(''n'', 10001))', :'k3'), '22023',
    'note is too long: at most 10000 characters', 'an over-long note');
SELECT throws_ok(format('SELECT runrow.resolve_approval(%L, true, ''x'')', repeat('0', 64)), 'P0002',
    format('idempotency_key %s does not exist', repeat('0', 64)), 'an unknown key');
SELECT is(pg_temp.steps_written(), :'before', 'bad input wrote nothing');

SELECT * FROM finish();
ROLLBACK;
