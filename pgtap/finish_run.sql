-- runrow.finish_run: the fenced terminal write. completed / failed / cancelled, the claim
-- cleared, exactly one complete event; a second finish or a finish after a reap is
-- false and writes nothing; bad input for every argument.
BEGIN;
\ir helpers/setup.psql
\ir helpers/row_versions.psql
SELECT plan(50);
SELECT pg_temp.drain_queue();

\set sig '''{uuid,uuid,text,jsonb,text}'''
SELECT has_function('runrow', 'finish_run', :sig::name[], 'finish_run(run_id, claim_token, status, result, error) exists');
SELECT is_definer('runrow', 'finish_run', :sig::name[], 'finish_run is SECURITY DEFINER');
SELECT function_privs_are('runrow', 'finish_run', :sig::name[], 'runrow_worker', ARRAY['EXECUTE'],
    'runrow_worker may finish');
SELECT function_privs_are('runrow', 'finish_run', :sig::name[], 'runrow_client', ARRAY[]::name[],
    'runrow_client may not finish');
SELECT function_privs_are('runrow', 'finish_run', :sig::name[], 'public', ARRAY[]::name[],
    'PUBLIC may not finish');

-- completed, with a result: two turns of one conversation, the second waits.
\set conv '''dddddddd-0000-0000-0000-000000000001'''
SELECT pg_temp.new_run(:conv) AS r1 \gset
SELECT pg_temp.new_run(:conv) AS r1next \gset
SELECT pg_temp.claim(:'r1') AS tok1 \gset
SELECT count(*) AS n1 FROM runrow.run_event WHERE run_id = :'r1' \gset
SET LOCAL ROLE runrow_worker;
SELECT runrow.finish_run(run_id => :'r1', claim_token => :'tok1', status => 'completed',
    result => '{"text": "done", "usage": {"output_tokens": 3}}') AS fin1 \gset
RESET ROLE;
SELECT is(:'fin1'::boolean, true, 'finish_run returns true for the owner');
SELECT is(
    (SELECT (a.status, a.result, a.error, a.finished_at = now(), a.claim_token, a.claim_expires_at,
             a.worker_id, a.attempt)::text FROM runrow.agent_run AS a WHERE a.id = :'r1'),
    (SELECT ('completed', '{"text": "done", "usage": {"output_tokens": 3}}'::jsonb, NULL::text, true,
             NULL::uuid, NULL::timestamptz, 'pgtap', 1)::text),
    'the run is completed with its result, finished now, the token and lease cleared');
SELECT results_eq(
    format('SELECT seq, type, payload FROM runrow.run_event WHERE run_id = %L AND seq > %s ORDER BY seq', :'r1', :'n1'),
    format($$VALUES (%s::bigint, 'complete'::text,
        '{"type": "complete", "status": "completed", "result": {"text": "done", "usage": {"output_tokens": 3}},
          "error": null}'::jsonb)$$, :'n1'::int + 1),
    'exactly one event is journaled: complete with status, result and error, at the next seq');
SELECT is((SELECT run_id FROM runrow.claim_run('w')), :'r1next'::uuid,
    'the conversation''s next turn is claimable at once');

-- failed, with an error and no result.
SELECT pg_temp.new_run() AS r2 \gset
SELECT pg_temp.claim(:'r2') AS tok2 \gset
SELECT ok(runrow.finish_run(:'r2', :'tok2', 'failed', error => 'model refused'), 'finish failed returns true');
SELECT is(
    (SELECT (a.status, a.result, a.error, a.finished_at = now(), a.claim_token, a.claim_expires_at)::text
     FROM runrow.agent_run AS a WHERE a.id = :'r2'),
    (SELECT ('failed', NULL::jsonb, 'model refused', true, NULL::uuid, NULL::timestamptz)::text),
    'the run is failed with its error, the claim cleared');
SELECT is(
    (SELECT payload FROM runrow.run_event WHERE run_id = :'r2' AND type = 'complete'),
    '{"type": "complete", "status": "failed", "result": null, "error": "model refused"}'::jsonb,
    'complete carries status failed and the error');

-- cancelled, after a stop: keeps the partial output already journaled.
SELECT pg_temp.new_run() AS r3 \gset
SELECT pg_temp.claim(:'r3') AS tok3 \gset
SELECT runrow.append_events(:'r3', :'tok3', '[{"type": "text_delta", "text": "partial"}]') AS partial_seq \gset
SELECT a.conversation_id AS conv3 FROM runrow.agent_run AS a WHERE a.id = :'r3' \gset
SELECT is((SELECT action FROM runrow.stop_conversation(:'conv3')), 'cancel_requested', 'a stop is requested');
SELECT ok(runrow.finish_run(:'r3', :'tok3', 'cancelled', result => '{"text": "partial"}', error => 'stopped'),
    'finish cancelled returns true');
SELECT is(
    (SELECT (a.status, a.cancel_requested, a.result, a.error, a.claim_token)::text FROM runrow.agent_run AS a
     WHERE a.id = :'r3'),
    (SELECT ('cancelled', true, '{"text": "partial"}'::jsonb, 'stopped', NULL::uuid)::text),
    'the run is cancelled, the claim cleared');
SELECT results_eq(
    format('SELECT type FROM runrow.run_event WHERE run_id = %L AND seq >= %s ORDER BY seq', :'r3', :'partial_seq'),
    $$VALUES ('text_delta'::text), ('cancel_requested'), ('complete')$$,
    'the partial output stays journaled before cancel_requested and complete');
SELECT is((SELECT payload ->> 'status' FROM runrow.run_event WHERE run_id = :'r3' AND type = 'complete'), 'cancelled',
    'complete carries status cancelled');

-- A worker whose turn finished just as the stop landed may still report completed.
SELECT pg_temp.new_run() AS r4 \gset
SELECT pg_temp.claim(:'r4') AS tok4 \gset
SELECT a.conversation_id AS conv4 FROM runrow.agent_run AS a WHERE a.id = :'r4' \gset
SELECT is((SELECT action FROM runrow.stop_conversation(:'conv4')), 'cancel_requested', 'a stop is requested on r4');
SELECT ok(runrow.finish_run(:'r4', :'tok4', 'completed'), 'a completed finish after a cancel request is accepted');

-- Fenced out: a second finish, whatever status; a wrong token; an unknown run.
SELECT pg_temp.written() AS before \gset
SELECT is(runrow.finish_run(:'r1', :'tok1', 'completed'), false, 'a second finish returns false');
SELECT is(runrow.finish_run(:'r1', :'tok1', 'failed', error => 'late'), false,
    'a second finish with another status returns false');
SELECT is(runrow.finish_run(:'r1next', gen_random_uuid(), 'completed'), false, 'a wrong token returns false');
SELECT is(runrow.finish_run(gen_random_uuid(), :'tok1', 'completed'), false, 'an unknown run returns false');
SELECT is(pg_temp.written(), :'before', 'none of them wrote anything');
SELECT is((SELECT count(*)::int FROM runrow.run_event WHERE run_id = :'r1' AND type = 'complete'), 1,
    'the first finish''s complete event is the only one');
SELECT is((SELECT a.status FROM runrow.agent_run AS a WHERE a.id = :'r1next'), 'running',
    'the run with a wrong token guessed at is still running');

-- A lapsed lease is not a fence by itself: until a reaper ends the run, its owner may.
SELECT pg_temp.new_run() AS r4b \gset
SELECT pg_temp.claim(:'r4b') AS tok4b \gset
SELECT pg_temp.expire(:'r4b');
SELECT ok(runrow.finish_run(:'r4b', :'tok4b', 'completed'), 'a finish after the lease lapsed, before any reap, wins');
SELECT is_empty('SELECT * FROM runrow.reap_expired_runs(0)', 'and leaves the reaper nothing to do');

-- Fenced out: a finish after a reap (failed: at-most-once) and after a requeue.
SELECT pg_temp.new_run() AS r5 \gset
SELECT pg_temp.claim(:'r5') AS tok5 \gset
SELECT pg_temp.expire(:'r5');
SELECT is((SELECT outcome FROM runrow.reap_expired_runs(0) WHERE run_id = :'r5'), 'failed', 'r5 is reaped failed');
SELECT pg_temp.written() AS before \gset
SELECT is(runrow.finish_run(:'r5', :'tok5', 'completed', '{"text": "too late"}'), false,
    'the zombie''s finish after a reap returns false');
SELECT is(pg_temp.written(), :'before', 'and writes nothing: the reaper''s ending stands');
SELECT is((SELECT (a.status, a.result)::text FROM runrow.agent_run AS a WHERE a.id = :'r5'), '(failed,)',
    'the run keeps the reaper''s status and no result');
SELECT pg_temp.new_run(attempts => 2) AS r6 \gset
SELECT pg_temp.claim(:'r6') AS tok6 \gset
SELECT pg_temp.expire(:'r6');
SELECT is((SELECT outcome FROM runrow.reap_expired_runs(0) WHERE run_id = :'r6'), 'requeued', 'r6 is reaped requeued');
SELECT pg_temp.written() AS before \gset
SELECT is(runrow.finish_run(:'r6', :'tok6', 'completed'), false, 'a finish of a requeued run with the old token is false');
SELECT is(pg_temp.written(), :'before', 'and writes nothing: the run stays queued');
SELECT pg_temp.claim(:'r6') AS tok7 \gset

-- Bad input: each argument, nothing written.
SELECT pg_temp.written() AS before \gset
SELECT throws_ok(format('SELECT runrow.finish_run(NULL, %L, ''completed'')', :'tok7'), '22004',
    'run_id must not be NULL', 'run_id NULL');
SELECT throws_ok(format('SELECT runrow.finish_run(%L, NULL, ''completed'')', :'r6'), '22004',
    'claim_token must not be NULL', 'claim_token NULL');
SELECT throws_ok(format('SELECT runrow.finish_run(%L, %L, NULL)', :'r6', :'tok7'), '22004',
    'status must not be NULL', 'status NULL');
SELECT throws_ok(format('SELECT runrow.finish_run(%L, %L, ''dead'')', :'r6', :'tok7'), '22023',
    'status must be one of completed, failed, cancelled, got "dead"', 'status dead (the reaper''s, not the worker''s)');
SELECT throws_ok(format('SELECT runrow.finish_run(%L, %L, ''queued'')', :'r6', :'tok7'), '22023',
    'status must be one of completed, failed, cancelled, got "queued"', 'status queued');
SELECT throws_ok(format('SELECT runrow.finish_run(%L, %L, ''Completed'')', :'r6', :'tok7'), '22023',
    'status must be one of completed, failed, cancelled, got "Completed"', 'status is case-sensitive');
-- A bad value is quoted up to 80 characters: a 2 MB argument made a 2 MB message and log line.
SELECT throws_ok(format('SELECT runrow.finish_run(%L, %L, %L)', :'r6', :'tok7', repeat('x', 2000000)), '22023',
    format('status must be one of completed, failed, cancelled, got "%s"', repeat('x', 80)),
    'a huge status is quoted up to 80 characters');
SELECT throws_ok(
    format('SELECT runrow.finish_run(%L, %L, ''completed'', to_jsonb(repeat(''x'', 1048576)))', :'r6', :'tok7'),
    '22023', 'result is too large: the limit is 1 MiB', 'result over 1 MiB');
-- A result every JSON client reads back (migration 0069): 100 levels, or 1e400, would stop the
-- run's webhook and GET /runs/{id}. The table refuses it too, for writes around finish_run.
SELECT throws_ok(format('SELECT runrow.finish_run(%L, %L, ''completed'', %L)', :'r6', :'tok7',
        repeat('[', 101) || repeat(']', 101)),
    '22023', 'result nests 100 levels deep or more: JSON clients cannot read it back (at most 99)',
    'a result nested 100 levels deep');
SELECT throws_ok(format('SELECT runrow.finish_run(%L, %L, ''completed'', ''{"n": -1e400}'')', :'r6', :'tok7'),
    '22023', 'result holds a number no double can hold (beyond ±1.7976931348623157e308): JSON clients cannot '
    'read it back', 'a result holding -1e400');
SELECT throws_ok(format('UPDATE runrow.agent_run SET result = %L WHERE id = %L',
        repeat('{"a": ', 150) || '1' || repeat('}', 150), :'r6'),
    '23514', NULL, 'agent_run_result_portable: a direct UPDATE of a result 150 levels deep is refused');
SELECT is((SELECT conname::text FROM pg_constraint
           WHERE conrelid = 'runrow.agent_run'::regclass AND conname = 'agent_run_result_portable'),
    'agent_run_result_portable', 'the table carries the rule as a CHECK a DBA can read');
SELECT throws_ok(format('SELECT runrow.finish_run(%L, %L, ''failed'', NULL, repeat(''e'', 10001))', :'r6', :'tok7'),
    '22023', 'error is too long: at most 10000 characters', 'error over 10000 characters');
SELECT is(pg_temp.written(), :'before', 'bad input wrote nothing');
SELECT ok(runrow.finish_run(:'r6', :'tok7', 'failed', NULL, repeat('e', 10000)),
    'an error of exactly 10000 characters is accepted (and the run is still finishable after bad input)');

SELECT * FROM finish();
ROLLBACK;
