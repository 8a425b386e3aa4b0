-- runrow.finish_and_claim_runs: finish_runs and claim_runs in one call and one UPDATE. The
-- endings are fenced run by run as finish_runs fences them, the claim follows claim_runs'
-- rules, the journal is what the two calls would write, a run fenced out writes nothing while
-- the others (and the claim) proceed, and bad input of either part writes nothing at all.
-- The collision path (a claim that collides, the endings written alone) needs two sessions:
-- tests/test_claim_rolled_back.py.
BEGIN;
\ir helpers/setup.psql
\ir helpers/row_versions.psql
\ir helpers/lifecycle.psql
SELECT plan(46);
SELECT pg_temp.drain_queue();

\set sig '''{jsonb,text,integer,integer}'''
SELECT has_function('runrow', 'finish_and_claim_runs', :sig::name[], 'finish_and_claim_runs(runs, worker_id, max_runs, lease_seconds) exists');
SELECT is_definer('runrow', 'finish_and_claim_runs', :sig::name[], 'finish_and_claim_runs is SECURITY DEFINER');
SELECT function_privs_are('runrow', 'finish_and_claim_runs', :sig::name[], 'runrow_worker', ARRAY['EXECUTE'],
    'runrow_worker may finish and claim');
SELECT function_privs_are('runrow', 'finish_and_claim_runs', :sig::name[], 'runrow_client', ARRAY[]::name[],
    'runrow_client may not');
SELECT function_privs_are('runrow', 'finish_and_claim_runs', :sig::name[], 'public', ARRAY[]::name[],
    'PUBLIC may not');
SELECT isnt(obj_description('runrow.finish_and_claim_runs(jsonb, text, integer, integer)'::regprocedure, 'pg_proc'),
    NULL, 'finish_and_claim_runs has a COMMENT stating its contract');

-- Happy path: two running runs end (h1 with its next turn queued behind it), three queued
-- runs of other conversations wait; max_runs 2 claims the two oldest of them.
\set conv1 '''eeeeeeee-0000-0000-0000-0000000000a1'''
SELECT pg_temp.running(conv => :conv1) AS h1 \gset
SELECT pg_temp.running() AS h2 \gset
SELECT pg_temp.new_run(:conv1) AS h1next \gset
SELECT pg_temp.new_run() AS q1 \gset
SELECT pg_temp.new_run() AS q2 \gset
SELECT pg_temp.new_run() AS q3 \gset
SELECT count(*) AS n1 FROM runrow.run_event WHERE run_id = :'h1' \gset
SELECT count(*) AS n2 FROM runrow.run_event WHERE run_id = :'h2' \gset
SELECT count(*) AS nq1 FROM runrow.run_event WHERE run_id = :'q1' \gset
SELECT jsonb_build_array(
    jsonb_build_object('run_id', :'h1', 'claim_token', pg_temp.token(:'h1'), 'status', 'completed',
        'result', '{"text": "hi"}'::jsonb,
        'events', '[{"type": "text_delta", "text": "h"}, {"type": "text_delta", "text": "i"}]'::jsonb),
    jsonb_build_object('run_id', :'h2', 'claim_token', pg_temp.token(:'h2'), 'status', 'failed',
        'error', 'model refused')) AS batch1 \gset
SET LOCAL ROLE runrow_worker;
CREATE TEMP TABLE out1 AS
SELECT row_number() OVER () AS n, * FROM runrow.finish_and_claim_runs(:'batch1', 'w-one', 2, 45);
RESET ROLE;
SELECT results_eq('SELECT n::int, run_id, finished, last_seq, claim_token IS NULL FROM out1 WHERE n <= 2 ORDER BY n',
    format($$VALUES (1, %L::uuid, true, %s::bigint, true), (2, %L::uuid, true, %s::bigint, true)$$,
        :'h1', :'n1'::int + 3, :'h2', :'n2'::int + 1),
    'a row per element of runs first, in input order: finished, the seq of its complete event, no claim columns');
SELECT results_eq('SELECT run_id, finished, last_seq FROM out1 WHERE n > 2 ORDER BY n',
    format($$VALUES (%L::uuid, NULL::boolean, NULL::bigint), (%L::uuid, NULL, NULL)$$, :'q1', :'q2'),
    'then a row per claimed run, in claim order (max_runs 2: the two oldest), finished NULL');
SELECT results_eq(
    format($$SELECT status, result, error, finished_at = now(), claim_token, claim_expires_at FROM runrow.agent_run
             WHERE id = ANY (ARRAY[%L, %L]::uuid[]) ORDER BY array_position(ARRAY[%L, %L]::uuid[], id)$$,
        :'h1', :'h2', :'h1', :'h2'),
    $$VALUES ('completed'::text, '{"text": "hi"}'::jsonb, NULL::text, true, NULL::uuid, NULL::timestamptz),
             ('failed', NULL, 'model refused', true, NULL, NULL)$$,
    'the ended runs have their status, result and error, finished now, the claim cleared');
SELECT results_eq(
    format('SELECT seq, type, payload FROM runrow.run_event WHERE run_id = %L AND seq > %s ORDER BY seq', :'h1', :'n1'),
    format($$VALUES (%s::bigint, 'text_delta'::text, '{"type": "text_delta", "text": "h"}'::jsonb),
                    (%s, 'text_delta', '{"type": "text_delta", "text": "i"}'),
                    (%s, 'complete', '{"type": "complete", "status": "completed", "result": {"text": "hi"}, "error": null}')$$,
        :'n1'::int + 1, :'n1'::int + 2, :'n1'::int + 3),
    'h1: its events at the next seqs, then the one complete event, as finish_runs journals them');
SELECT results_eq(
    format($$SELECT o.claim_token, o.conversation_id, o.attempt, o.max_attempts, o.model, o.prompt_id, o.system_prompt,
                    o.tools, o.user_id, o.user_message_id, o.metadata, o.claim_expires_at
             FROM out1 AS o WHERE o.run_id = %L$$, :'q1'),
    format($$SELECT a.claim_token, a.conversation_id, a.attempt, a.max_attempts, a.model, a.prompt_id, p.system_prompt,
                    p.tools, a.user_id, a.user_message_id, a.metadata, a.claim_expires_at
             FROM runrow.agent_run AS a JOIN runrow.prompt AS p ON p.id = a.prompt_id WHERE a.id = %L$$, :'q1'),
    'a claimed row carries what claim_runs returns: the new token, the pinned model, prompt and tools');
SELECT results_eq(
    format($$SELECT status, worker_id, attempt, claim_expires_at = now() + interval '45 seconds', last_heartbeat_at = now(),
                    started_at = now() FROM runrow.agent_run WHERE id = ANY (ARRAY[%L, %L]::uuid[]) ORDER BY enqueue_seq$$,
        :'q1', :'q2'),
    $$VALUES ('running'::text, 'w-one'::text, 1, true, true, true), ('running', 'w-one', 1, true, true, true)$$,
    'the claimed runs are running for worker w-one, attempt 1, a lease of lease_seconds on the database clock');
SELECT results_eq(
    format('SELECT seq, type, payload FROM runrow.run_event WHERE run_id = %L AND seq > %s ORDER BY seq', :'q1', :'nq1'),
    format($$VALUES (%s::bigint, 'run_claimed'::text, '{"type": "run_claimed", "worker_id": "w-one", "attempt": 1}'::jsonb)$$,
        :'nq1'::int + 1),
    'a claimed run journals run_claimed at its next seq, as claim_runs does');
SELECT ok((SELECT queued_seconds >= 0 FROM out1 WHERE run_id = :'q1'), 'queued_seconds is the time it waited');
SELECT is(pg_temp.status(:'q3'), 'queued', 'q3 is past max_runs and stays queued');
SELECT is(pg_temp.status(:'h1next'), 'queued',
    'the next turn of a conversation ended in this call is not claimed by it when the walk filled every slot');
SELECT is((SELECT claim_blocked FROM runrow.agent_run WHERE id = :'h1next'), false,
    'and is not left marked blocked: its turn ahead ended');
SELECT is((SELECT run_id FROM runrow.claim_run('w')), :'h1next'::uuid,
    'the next claim takes it (before q3: it waited longer)');
SELECT is_empty(format($$SELECT * FROM runrow.audit() WHERE run_id = ANY (ARRAY[%L, %L, %L, %L]::uuid[])$$,
    :'h1', :'h2', :'q1', :'q2'), 'audit finds nothing wrong with the ended and the claimed runs');

-- A conversation's next turn behind a run ended here, with slots left: claimed in the same
-- call, after the endings, as claim_runs after finish_runs would claim it.
SELECT pg_temp.drain_queue();
\set conv2 '''eeeeeeee-0000-0000-0000-0000000000a2'''
SELECT pg_temp.running(conv => :conv2) AS t1 \gset
SELECT pg_temp.new_run(:conv2) AS t2 \gset
SELECT format('[{"run_id": "%s", "claim_token": "%s", "status": "completed"}]', :'t1', pg_temp.token(:'t1')) AS t1_ack \gset
SELECT results_eq(format('SELECT run_id, finished FROM runrow.finish_and_claim_runs(%L, ''w-three'', 5)', :'t1_ack'),
    format($$VALUES (%L::uuid, true), (%L::uuid, NULL::boolean)$$, :'t1', :'t2'),
    'the next turn of a conversation ended in this call is claimed by it when slots are left');
SELECT is((SELECT (status, worker_id, claim_blocked)::text FROM runrow.agent_run WHERE id = :'t2'), '(running,w-three,f)',
    'it is running for this worker, not marked blocked');
SELECT is(pg_temp.journal(:'t1')::text, '{user_message_created,run_queued,run_claimed,complete}',
    'the ended turn''s journal ends in its one complete');
SELECT is_empty(format($$SELECT * FROM runrow.audit() WHERE run_id = ANY (ARRAY[%L, %L]::uuid[])$$, :'t1', :'t2'),
    'audit finds nothing wrong with either turn');

-- Each part alone: an empty runs is a claim; nothing claimable, only the endings.
SELECT pg_temp.drain_queue();
SELECT pg_temp.new_run() AS solo \gset
SELECT results_eq('SELECT run_id, finished FROM runrow.finish_and_claim_runs(''[]'', ''w'')',
    format($$VALUES (%L::uuid, NULL::boolean)$$, :'solo'), 'runs [] only claims (max_runs defaults to 10)');
SELECT is(pg_temp.status(:'solo'), 'running', 'and the run is running');
SELECT format('[{"run_id": "%s", "claim_token": "%s", "status": "completed"}]', :'solo', pg_temp.token(:'solo')) AS solo_ack \gset
SELECT results_eq(format('SELECT run_id, finished, claim_token IS NULL FROM runrow.finish_and_claim_runs(%L, ''w'')', :'solo_ack'),
    format($$VALUES (%L::uuid, true, true)$$, :'solo'), 'with nothing queued it only ends the runs');
SELECT is(pg_temp.status(:'solo'), 'completed', 'and the run is completed');
SELECT pg_temp.written() AS before \gset
SELECT is_empty('SELECT * FROM runrow.finish_and_claim_runs(''[]'', ''w'')', 'nothing to end, nothing queued: no rows');
SELECT is(pg_temp.written(), :'before', 'and nothing written');

-- Fenced out among good ones: a wrong token, an unknown run, a run reaped and requeued whose
-- old token comes back while it is the head of the queue. Each ending fenced out writes
-- nothing and comes back false; the good ending and the claim proceed. The requeued run is
-- claimed afresh by this very call (a run in both lists is queued, so its token cannot match).
SELECT pg_temp.drain_queue();
SELECT pg_temp.running() AS g1 \gset
SELECT pg_temp.running() AS wrongtok \gset
SELECT pg_temp.running(attempts => 2) AS requeued \gset
SELECT pg_temp.token(:'requeued') AS oldtok \gset
SELECT pg_temp.expire(:'requeued');
SELECT is((SELECT outcome FROM runrow.reap_expired_runs(0) WHERE run_id = :'requeued'), 'requeued', 'requeued is reaped');
SELECT md5(string_agg(a.ctid::text || coalesce(a.claim_token::text, ''), ',' ORDER BY a.id)) AS fenced_rows
FROM runrow.agent_run AS a WHERE a.id = :'wrongtok' \gset
SELECT count(*) AS fenced_events FROM runrow.run_event WHERE run_id = :'wrongtok' \gset
\set unknown '''00000000-0000-0000-0000-00000000beef'''
SELECT jsonb_build_array(
    jsonb_build_object('run_id', :'g1', 'claim_token', pg_temp.token(:'g1'), 'status', 'completed'),
    jsonb_build_object('run_id', :'wrongtok', 'claim_token', gen_random_uuid(), 'status', 'completed',
        'events', '[{"type": "text_delta", "text": "zombie"}]'::jsonb),
    jsonb_build_object('run_id', :unknown, 'claim_token', gen_random_uuid(), 'status', 'failed'),
    jsonb_build_object('run_id', :'requeued', 'claim_token', :'oldtok', 'status', 'completed',
        'events', '[{"type": "text_delta", "text": "late"}]'::jsonb)) AS batch2 \gset
SET LOCAL ROLE runrow_worker;
CREATE TEMP TABLE out2 AS SELECT row_number() OVER () AS n, * FROM runrow.finish_and_claim_runs(:'batch2', 'w-two');
RESET ROLE;
SELECT results_eq('SELECT n::int, run_id, finished, last_seq IS NOT NULL FROM out2 ORDER BY n',
    format($$VALUES (1, %L::uuid, true, true), (2, %L::uuid, false, false), (3, %L::uuid, false, false),
                    (4, %L::uuid, false, false), (5, %L::uuid, NULL, false)$$,
        :'g1', :'wrongtok', :unknown, :'requeued', :'requeued'),
    'fenced-out endings come back finished = false; the requeued run is claimed again in the same call');
SELECT is((SELECT md5(string_agg(a.ctid::text || coalesce(a.claim_token::text, ''), ',' ORDER BY a.id))
           FROM runrow.agent_run AS a WHERE a.id = :'wrongtok'),
    :'fenced_rows', 'the run whose token was guessed at was not touched (same row version)');
SELECT is((SELECT count(*) FROM runrow.run_event WHERE run_id = :'wrongtok'), :'fenced_events'::bigint,
    'and nothing was journaled for it');
SELECT is((SELECT (status, attempt, claim_token)::text FROM runrow.agent_run WHERE id = :'requeued'),
    (SELECT ('running', 2, claim_token)::text FROM out2 WHERE n = 5),
    'the requeued run runs its second attempt under the token this call returned');
SELECT is(pg_temp.count_events(:'requeued', 'text_delta'), 0, 'its stale ending''s events were not journaled');
SELECT is(pg_temp.status(:'g1'), 'completed', 'g1 is completed');

-- Bad input, of the endings or of the claim: an error naming the element or the argument,
-- and nothing written, neither the good endings nor the claim.
SELECT pg_temp.drain_queue();
SELECT pg_temp.running() AS b1 \gset
SELECT pg_temp.new_run() AS waiting \gset
SELECT jsonb_build_array(jsonb_build_object('run_id', :'b1', 'claim_token', pg_temp.token(:'b1'),
    'status', 'completed')) AS good \gset
SELECT pg_temp.written() AS before \gset
SELECT throws_ok('SELECT * FROM runrow.finish_and_claim_runs(NULL, ''w'')', '22004', 'runs must not be NULL', 'runs NULL');
SELECT throws_ok('SELECT * FROM runrow.finish_and_claim_runs(''{"run_id": 1}'', ''w'')', '22023',
    'runs must be a JSON array of run objects, got object', 'runs an object, not an array');
SELECT throws_ok(format('SELECT * FROM runrow.finish_and_claim_runs(%L, ''w'')',
        :'good'::jsonb || jsonb_build_object('run_id', :'b1', 'claim_token', gen_random_uuid(), 'status', 'dead')),
    '22023', 'runs[1].status must be one of completed, failed, cancelled, got "dead"',
    'a bad element after a good one (the check finish_runs makes, shared)');
SELECT throws_ok(format('SELECT * FROM runrow.finish_and_claim_runs(%L, ''w'', 0)', :'good'), '22023',
    'max_runs must be between 1 and 1000, got 0', 'max_runs 0');
SELECT throws_ok(format('SELECT * FROM runrow.finish_and_claim_runs(%L, ''w'', 1001)', :'good'), '22023',
    'max_runs must be between 1 and 1000, got 1001', 'max_runs over 1000');
SELECT throws_ok(format('SELECT * FROM runrow.finish_and_claim_runs(%L, ''w'', 1, NULL)', :'good'), '22004',
    'lease_seconds must not be NULL', 'lease_seconds NULL');
SELECT throws_ok(format('SELECT * FROM runrow.finish_and_claim_runs(%L, ''w'', 1, 3601)', :'good'), '22023',
    'lease_seconds must be between 1 and 3600, got 3601', 'lease_seconds over an hour');
SELECT throws_ok(format('SELECT * FROM runrow.finish_and_claim_runs(%L, '''')', :'good'), '22023',
    'worker_id must be NULL or 1 to 200 characters', 'worker_id empty');
SELECT is(pg_temp.written(), :'before', 'no bad call wrote anything: not the good ending, not the claim');
SELECT results_eq(format('SELECT run_id, finished FROM runrow.finish_and_claim_runs(%L, ''w'')', :'good'),
    format($$VALUES (%L::uuid, true), (%L::uuid, NULL::boolean)$$, :'b1', :'waiting'),
    'and the same call goes through once its arguments are good');

SELECT * FROM finish();
ROLLBACK;
