-- runrow.finish_runs: many fenced terminal writes in one call. Each run is fenced on its own
-- exactly as finish_run (a fenced-out run writes nothing, the others proceed), its events
-- and complete event are journaled as append_events + finish_run would, the next turn of
-- each conversation becomes claimable; bad input of each kind names the element and
-- writes nothing.
BEGIN;
\ir helpers/setup.psql
\ir helpers/row_versions.psql
\ir helpers/lifecycle.psql
\ir helpers/audit.psql
SELECT plan(71);
SELECT pg_temp.drain_queue();

\set sig '''{jsonb}'''
SELECT has_function('runrow', 'finish_runs', :sig::name[], 'finish_runs(runs) exists');
SELECT is_definer('runrow', 'finish_runs', :sig::name[], 'finish_runs is SECURITY DEFINER');
SELECT function_privs_are('runrow', 'finish_runs', :sig::name[], 'runrow_worker', ARRAY['EXECUTE'],
    'runrow_worker may finish');
SELECT function_privs_are('runrow', 'finish_runs', :sig::name[], 'runrow_client', ARRAY[]::name[],
    'runrow_client may not finish');
SELECT function_privs_are('runrow', 'finish_runs', :sig::name[], 'public', ARRAY[]::name[],
    'PUBLIC may not finish');
SELECT isnt(obj_description('runrow.finish_runs(jsonb)'::regprocedure, 'pg_proc'), NULL,
    'finish_runs has a COMMENT stating its contract');

-- Happy path: three runs of three conversations, one with its next turn queued behind it.
\set conv1 '''eeeeeeee-0000-0000-0000-000000000001'''
SELECT pg_temp.running(conv => :conv1) AS h1 \gset
SELECT pg_temp.new_run(:conv1) AS h1next \gset
SELECT pg_temp.running() AS h2 \gset
SELECT pg_temp.running() AS h3 \gset
SELECT count(*) AS n1 FROM runrow.run_event WHERE run_id = :'h1' \gset
SELECT count(*) AS n2 FROM runrow.run_event WHERE run_id = :'h2' \gset
SELECT count(*) AS n3 FROM runrow.run_event WHERE run_id = :'h3' \gset
-- A claim now finds h1next blocked behind h1 and marks it: the finish must clear that.
SELECT is_empty('SELECT * FROM runrow.claim_run(''w'')', 'h1next waits behind h1');
SELECT is((SELECT claim_blocked FROM runrow.agent_run WHERE id = :'h1next'), true, 'and is marked blocked');

SELECT jsonb_build_array(
    jsonb_build_object('run_id', :'h1', 'claim_token', pg_temp.token(:'h1'), 'status', 'completed',
        'result', '{"text": "hi"}'::jsonb,
        'events', '[{"type": "text_delta", "text": "h"}, {"type": "text_delta", "text": "i"}]'::jsonb),
    jsonb_build_object('run_id', :'h2', 'claim_token', pg_temp.token(:'h2'), 'status', 'failed',
        'error', 'model refused'),
    jsonb_build_object('run_id', :'h3', 'claim_token', pg_temp.token(:'h3'), 'status', 'cancelled',
        'result', NULL, 'error', NULL, 'events', NULL)) AS batch1 \gset
SET LOCAL ROLE runrow_worker;
CREATE TEMP TABLE fin1 AS SELECT row_number() OVER () AS n, * FROM runrow.finish_runs(:'batch1');
RESET ROLE;
SELECT results_eq('SELECT n::int, run_id, finished, last_seq FROM fin1 ORDER BY n',
    format($$VALUES (1, %L::uuid, true, %s::bigint), (2, %L::uuid, true, %s::bigint), (3, %L::uuid, true, %s::bigint)$$,
        :'h1', :'n1'::int + 3, :'h2', :'n2'::int + 1, :'h3', :'n3'::int + 1),
    'one row per element in input order: finished, with the seq of its complete event');
SELECT results_eq(
    format($$SELECT status, result, error, finished_at = now(), claim_token, claim_expires_at FROM runrow.agent_run
             WHERE id = ANY (ARRAY[%L, %L, %L]::uuid[]) ORDER BY array_position(ARRAY[%L, %L, %L]::uuid[], id)$$,
        :'h1', :'h2', :'h3', :'h1', :'h2', :'h3'),
    $$VALUES ('completed'::text, '{"text": "hi"}'::jsonb, NULL::text, true, NULL::uuid, NULL::timestamptz),
             ('failed', NULL, 'model refused', true, NULL, NULL),
             ('cancelled', NULL, NULL, true, NULL, NULL)$$,
    'each run has its status, result and error, finished now, the claim cleared');
SELECT results_eq(
    format('SELECT seq, type, payload FROM runrow.run_event WHERE run_id = %L AND seq > %s ORDER BY seq', :'h1', :'n1'),
    format($$VALUES (%s::bigint, 'text_delta'::text, '{"type": "text_delta", "text": "h"}'::jsonb),
                    (%s, 'text_delta', '{"type": "text_delta", "text": "i"}'),
                    (%s, 'complete', '{"type": "complete", "status": "completed", "result": {"text": "hi"}, "error": null}')$$,
        :'n1'::int + 1, :'n1'::int + 2, :'n1'::int + 3),
    'h1: its events at the next seqs, then the one complete event');
SELECT results_eq(
    format('SELECT seq, type, payload FROM runrow.run_event WHERE run_id = %L AND seq > %s ORDER BY seq', :'h2', :'n2'),
    format($$VALUES (%s::bigint, 'complete'::text,
        '{"type": "complete", "status": "failed", "result": null, "error": "model refused"}'::jsonb)$$, :'n2'::int + 1),
    'h2: only complete, with status failed and the error');
SELECT is((SELECT payload FROM runrow.run_event WHERE run_id = :'h3' AND type = 'complete'),
    '{"type": "complete", "status": "cancelled", "result": null, "error": null}'::jsonb,
    'h3: explicit JSON nulls mean no result, no error, no events');
SELECT is((SELECT claim_blocked FROM runrow.agent_run WHERE id = :'h1next'), false,
    'ending h1 cleared its next turn''s mark');
SELECT is((SELECT run_id FROM runrow.claim_run('w')), :'h1next'::uuid,
    'the conversation''s next turn is claimable at once');
SELECT is_empty(format($$SELECT * FROM runrow.audit() WHERE run_id = ANY (ARRAY[%L, %L, %L]::uuid[])$$,
    :'h1', :'h2', :'h3'), 'audit finds nothing wrong with the three runs (seqs, one complete, claim cleared)');

-- The journal is the one append_events + finish_run write in one transaction: two runs, the
-- same events and ending, one each way; their journals after run_claimed are identical.
SELECT pg_temp.running() AS single \gset
SELECT pg_temp.running() AS batched \gset
SELECT runrow.append_events(:'single', pg_temp.token(:'single'),
    '[{"type": "message_start"}, {"type": "text_delta", "text": "x"}, {"type": "message_stop"}]') AS s_seq \gset
SELECT ok(runrow.finish_run(:'single', pg_temp.token(:'single'), 'completed', '{"text": "x"}'), 'finish_run way');
SELECT ok((SELECT finished FROM runrow.finish_runs(jsonb_build_array(jsonb_build_object(
    'run_id', :'batched', 'claim_token', pg_temp.token(:'batched'), 'status', 'completed', 'result', '{"text": "x"}'::jsonb,
    'events', '[{"type": "message_start"}, {"type": "text_delta", "text": "x"}, {"type": "message_stop"}]'::jsonb)))),
    'finish_runs way');
SELECT results_eq(
    format($$SELECT seq, type, payload FROM runrow.run_event WHERE run_id = %L
             AND seq > (SELECT seq FROM runrow.run_event WHERE run_id = %L AND type = 'run_claimed') ORDER BY seq$$,
        :'batched', :'batched'),
    format($$SELECT seq, type, payload FROM runrow.run_event WHERE run_id = %L
             AND seq > (SELECT seq FROM runrow.run_event WHERE run_id = %L AND type = 'run_claimed') ORDER BY seq$$,
        :'single', :'single'),
    'finish_runs journals exactly what append_events + finish_run journal');
SELECT is((SELECT (status, result, error)::text FROM runrow.agent_run WHERE id = :'batched'),
    (SELECT (status, result, error)::text FROM runrow.agent_run WHERE id = :'single'),
    'and leaves the run row as finish_run does');

-- An empty batch: no rows, nothing written.
SELECT pg_temp.written() AS before \gset
SELECT is_empty('SELECT * FROM runrow.finish_runs(''[]'')', 'an empty batch returns no rows');
SELECT is(pg_temp.written(), :'before', 'and writes nothing');

-- Fenced out among good ones: a wrong token, a run already finished, an unknown run, a run
-- reaped and requeued (old token). Each writes nothing and comes back false; the others
-- proceed.
SELECT pg_temp.running() AS g1 \gset
SELECT pg_temp.running() AS wrongtok \gset
SELECT pg_temp.running(attempts => 2) AS requeued \gset
SELECT pg_temp.running() AS g2 \gset
SELECT pg_temp.token(:'requeued') AS oldtok \gset
SELECT pg_temp.expire(:'requeued');
SELECT is((SELECT outcome FROM runrow.reap_expired_runs(0) WHERE run_id = :'requeued'), 'requeued', 'requeued is reaped');
SELECT md5(string_agg(a.ctid::text || coalesce(a.claim_token::text, ''), ',' ORDER BY a.id)) AS fenced_rows
FROM runrow.agent_run AS a WHERE a.id = ANY (ARRAY[:'wrongtok', :'h2', :'requeued']::uuid[]) \gset
SELECT count(*) AS fenced_events FROM runrow.run_event WHERE run_id = ANY (ARRAY[:'wrongtok', :'h2', :'requeued']::uuid[]) \gset
\set unknown '''00000000-0000-0000-0000-00000000dead'''
SELECT jsonb_build_array(
    jsonb_build_object('run_id', :'g1', 'claim_token', pg_temp.token(:'g1'), 'status', 'completed',
        'events', '[{"type": "text_delta", "text": "g1"}]'::jsonb),
    jsonb_build_object('run_id', :'wrongtok', 'claim_token', gen_random_uuid(), 'status', 'completed',
        'events', '[{"type": "text_delta", "text": "zombie"}]'::jsonb),
    jsonb_build_object('run_id', :'h2', 'claim_token', gen_random_uuid(), 'status', 'completed'),
    jsonb_build_object('run_id', :unknown, 'claim_token', gen_random_uuid(), 'status', 'failed'),
    jsonb_build_object('run_id', :'requeued', 'claim_token', :'oldtok', 'status', 'completed',
        'events', '[{"type": "text_delta", "text": "late"}]'::jsonb),
    jsonb_build_object('run_id', :'g2', 'claim_token', pg_temp.token(:'g2'), 'status', 'completed')) AS batch2 \gset
SET LOCAL ROLE runrow_worker;
CREATE TEMP TABLE fin2 AS SELECT row_number() OVER () AS n, * FROM runrow.finish_runs(:'batch2');
RESET ROLE;
SELECT results_eq('SELECT n::int, run_id, finished, last_seq IS NOT NULL FROM fin2 ORDER BY n',
    format($$VALUES (1, %L::uuid, true, true), (2, %L::uuid, false, false), (3, %L::uuid, false, false),
                    (4, %L::uuid, false, false), (5, %L::uuid, false, false), (6, %L::uuid, true, true)$$,
        :'g1', :'wrongtok', :'h2', :unknown, :'requeued', :'g2'),
    'fenced-out runs come back finished = false with no last_seq; the others true');
SELECT is((SELECT md5(string_agg(a.ctid::text || coalesce(a.claim_token::text, ''), ',' ORDER BY a.id))
           FROM runrow.agent_run AS a WHERE a.id = ANY (ARRAY[:'wrongtok', :'h2', :'requeued']::uuid[])),
    :'fenced_rows', 'the fenced-out run rows were not touched (same row versions)');
SELECT is((SELECT count(*) FROM runrow.run_event WHERE run_id = ANY (ARRAY[:'wrongtok', :'h2', :'requeued']::uuid[])),
    :'fenced_events'::bigint, 'and nothing was journaled for them: not their events, not a complete');
SELECT is((SELECT (status, claim_token IS NOT NULL)::text FROM runrow.agent_run WHERE id = :'wrongtok'), '(running,t)',
    'the run whose token was guessed at is still running');
SELECT is(pg_temp.status(:'requeued'), 'queued', 'the requeued run stays queued');
SELECT is((SELECT array_agg(type ORDER BY seq)::text FROM runrow.run_event
           WHERE run_id = :'g1' AND seq > (SELECT seq FROM runrow.run_event WHERE run_id = :'g1' AND type = 'run_claimed')),
    '{text_delta,complete}', 'g1 got its event and complete');
SELECT is(pg_temp.status(:'g2'), 'completed', 'g2 is completed');
SELECT ok(runrow.finish_run(:'wrongtok', pg_temp.token(:'wrongtok'), 'completed'),
    'the real owner of the guessed-at run still finishes it');
SELECT pg_temp.claim(:'requeued') AS newtok \gset
SELECT ok(runrow.finish_run(:'requeued', :'newtok', 'completed'), 'and the requeued run runs again and finishes');

-- Bad input of each kind: an error naming the element and the field, nothing written, not
-- even the good element before the bad one.
SELECT pg_temp.running() AS b1 \gset
SELECT pg_temp.running() AS b2 \gset
SELECT jsonb_build_object('run_id', :'b1', 'claim_token', pg_temp.token(:'b1'), 'status', 'completed')::text AS good \gset
SELECT jsonb_build_object('run_id', :'b2', 'claim_token', pg_temp.token(:'b2'), 'status', 'completed') AS good2 \gset
SELECT pg_temp.written() AS before \gset
CREATE FUNCTION pg_temp.batch(second jsonb) RETURNS text LANGUAGE sql AS $$
    SELECT format('SELECT * FROM runrow.finish_runs(%L::jsonb)', jsonb_build_array(
        (SELECT jsonb_build_object('run_id', id, 'claim_token', claim_token, 'status', 'completed')
         FROM runrow.agent_run WHERE id = current_setting('tap.b1')::uuid), second))
$$;
SELECT set_config('tap.b1', :'b1', true) AS b1_setting \gset
SELECT throws_ok('SELECT * FROM runrow.finish_runs(NULL)', '22004', 'runs must not be NULL', 'runs NULL');
SELECT throws_ok('SELECT * FROM runrow.finish_runs(''{"run_id": 1}'')', '22023',
    'runs must be a JSON array of run objects, got object', 'runs an object, not an array');
SELECT throws_ok(format('SELECT * FROM runrow.finish_runs(%L)',
        (SELECT jsonb_agg(:'good'::jsonb) FROM generate_series(1, 1001))), '22023',
    'runs is too large: at most 1000 runs per call, got 1001', 'more than 1000 runs');
SELECT throws_ok(pg_temp.batch('"x"'), '22023', 'runs[1] must be a JSON object, got string', 'an element not an object');
SELECT throws_ok(pg_temp.batch(:'good2'::jsonb || '{"claimToken": "x"}'), '22023',
    'runs[1] has an unknown key "claimToken" (allowed: run_id, claim_token, status, result, error, events)',
    'an unknown key (a typo is not silently ignored)');
SELECT throws_ok(pg_temp.batch(:'good2'::jsonb - 'run_id'), '22004', 'runs[1].run_id must not be NULL', 'run_id missing');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{run_id}', '"not-a-uuid"')), '22023',
    'runs[1].run_id must be a UUID string, got "not-a-uuid"', 'run_id not a UUID');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{claim_token}', 'null')), '22004',
    'runs[1].claim_token must not be NULL', 'claim_token null');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{claim_token}', '7')), '22023',
    'runs[1].claim_token must be a UUID string, got 7', 'claim_token a number');
SELECT throws_ok(pg_temp.batch(:'good2'::jsonb - 'status'), '22004', 'runs[1].status must not be NULL', 'status missing');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{status}', '"dead"')), '22023',
    'runs[1].status must be one of completed, failed, cancelled, got "dead"', 'status dead (the reaper''s)');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{status}', '["completed"]')), '22023',
    'runs[1].status must be one of completed, failed, cancelled, got ["completed"]', 'status not a string');
SELECT throws_ok(pg_temp.batch(:'good2'::jsonb || jsonb_build_object('result', repeat('x', 1048576))), '22023',
    'runs[1].result is too large: the limit is 1 MiB', 'result over 1 MiB');
-- A result every JSON client reads back (migration 0069): its webhook payload and GET /runs/{id}
-- carry it. 99 levels pass; 100 do not; nor does a number beyond a double's range.
SELECT throws_ok(pg_temp.batch(:'good2'::jsonb || jsonb_build_object('result',
        (repeat('[', 101) || repeat(']', 101))::jsonb)), '22023',
    'runs[1].result nests 100 levels deep or more: JSON clients cannot read it back (at most 99)',
    'a result nested 100 levels deep');
SELECT throws_ok(pg_temp.batch(:'good2'::jsonb || '{"result": {"n": [1e400]}}'), '22023',
    'runs[1].result holds a number no double can hold (beyond ±1.7976931348623157e308): JSON clients cannot '
    'read it back', 'a result holding 1e400');
SELECT lives_ok(format('SELECT * FROM runrow._finish_runs_input(%L)', jsonb_build_array(:'good2'::jsonb
        || jsonb_build_object('result', (repeat('[', 100) || repeat(']', 100))::jsonb))),
    'a result nested 99 levels deep is taken');
SELECT throws_ok(pg_temp.batch(:'good2'::jsonb || '{"error": {"code": 1}}'), '22023',
    'runs[1].error must be a string or null, got object', 'error not a string');
SELECT throws_ok(pg_temp.batch(:'good2'::jsonb || jsonb_build_object('error', repeat('e', 10001))), '22023',
    'runs[1].error is too long: at most 10000 characters', 'error over 10000 characters');
SELECT throws_ok(pg_temp.batch(:'good2'::jsonb || '{"events": {"type": "x"}}'), '22023',
    'runs[1].events must be a JSON array of event objects, got object', 'events not an array');
SELECT throws_ok(pg_temp.batch(:'good2'::jsonb || jsonb_build_object('events',
        (SELECT jsonb_agg('{"type": "t"}'::jsonb) FROM generate_series(1, 1001)))), '22023',
    'runs[1].events is too large: at most 1000 events and 4 MiB per run', 'more than 1000 events');
SELECT throws_ok(pg_temp.batch(:'good2'::jsonb || '{"events": [{"type": "t"}, {"type": "t"}, {"type": "complete"}]}'),
    '22023', 'runs[1].events[2] must be an object with a non-empty string "type" that is not reserved '
        '("complete" and "run_*" are written by runrow itself) and has no control character', 'a reserved event type, named by its index');
SELECT throws_ok(pg_temp.batch(:'good2'::jsonb || '{"events": [{"type": "t\u009b2J"}]}'), '22023',
    'runs[1].events[0] must be an object with a non-empty string "type" that is not reserved '
    '("complete" and "run_*" are written by runrow itself) and has no control character', 'a type with a C1 CSI');
SELECT throws_ok(pg_temp.batch(:'good2'::jsonb || '{"events": [{"text": "no type"}]}'), '22023',
    'runs[1].events[0] must be an object with a non-empty string "type" that is not reserved '
        '("complete" and "run_*" are written by runrow itself) and has no control character', 'an event without a type');
SELECT throws_ok(pg_temp.batch(:'good'::jsonb), '22023',
    format('runs[1].run_id "%s" is already runs[0]: each run at most once per call', :'b1'), 'a run twice');
-- What only the casts after the first pass catch (36 bytes, hyphens in place, not hex) and
-- what only its key count catches (a run twice, spelled in another case), each reported as the
-- exact pass reports it: the first broken rule of the first bad element.
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{run_id}', '"zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"')),
    '22023', 'runs[1].run_id must be a UUID string, got "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"',
    'a run_id of the right shape but not hex');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{claim_token}', '"0000000-00000-0000-0000-000000000000"')),
    '22023', 'runs[1].claim_token must be a UUID string, got "0000000-00000-0000-0000-000000000000"',
    'a claim_token of 36 hex digits and hyphens, one hyphen out of place');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{claim_token}', '"{00000000-0000-0000-0000-000000000000}"')),
    '22023', 'runs[1].claim_token must be a UUID string, got "{00000000-0000-0000-0000-000000000000}"',
    'a braced claim_token (uuid input takes it; runrow does not)');
SELECT throws_ok(format('SELECT * FROM runrow.finish_runs(%L)', jsonb_build_array(
        jsonb_set(jsonb_set(:'good'::jsonb, '{run_id}', '"zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"'), '{status}', '"dead"'))),
    '22023', 'runs[0].run_id must be a UUID string, got "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"',
    'an element with two broken rules is reported by the first, the hex test included');
-- A run_id or claim_token of the UUID's shape that is not hex passes the first, cheap pass and
-- is caught by the casts or the exact pass: an earlier element broken that way is still the one
-- reported, before a later element broken by a rule the cheap pass sees.
SELECT throws_ok(format('SELECT * FROM runrow.finish_runs(%L)', jsonb_build_array(
        jsonb_set(:'good2'::jsonb, '{claim_token}', '"0000000g-0000-0000-0000-000000000000"'),
        :'good'::jsonb || '{"claimToken": "x"}')),
    '22023', 'runs[0].claim_token must be a UUID string, got "0000000g-0000-0000-0000-000000000000"',
    'a non-hex claim_token of the right shape is reported before a later element''s unknown key');
SELECT throws_ok(format('SELECT * FROM runrow.finish_runs(%L)', jsonb_build_array(
        :'good'::jsonb, jsonb_set(:'good2'::jsonb, '{run_id}', '"00000000-0000-0000-0000-00000000000G"'))),
    '22023', 'runs[1].run_id must be a UUID string, got "00000000-0000-0000-0000-00000000000G"',
    'a non-hex run_id of the right shape in an otherwise valid batch is refused by name');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good'::jsonb, '{run_id}', to_jsonb(upper(:'b1')))), '22023',
    format('runs[1].run_id "%s" is already runs[0]: each run at most once per call', upper(:'b1')),
    'a run twice, the second time in capitals');
SELECT is(pg_temp.written(), :'before', 'no bad batch wrote anything, not even its good first element');
SELECT is(pg_temp.status(:'b1'), 'running', 'b1 is still running');
SELECT results_eq(format('SELECT finished FROM runrow.finish_runs(%L)', jsonb_build_array(:'good'::jsonb,
        jsonb_build_object('run_id', upper(:'b2'), 'claim_token', upper(pg_temp.token(:'b2')::text), 'status', 'completed'))),
    $$VALUES (true), (true)$$, 'and the same runs finish once the batch is well formed (a UUID in capitals is one)');

-- The batch path pays no per-row trigger call: agent_run's rules, turn order and the outbox are
-- checked once per statement (0042; the row guards before it were skipped by their WHEN), and
-- a run's identity by a trigger gated on columns no claim or ending assigns (0044).
SELECT pg_temp.drain_queue();
SELECT count(pg_temp.new_run()) AS queued FROM generate_series(1, 5) \gset
SET LOCAL track_functions = 'all';
SELECT coalesce(pg_stat_get_xact_function_calls('runrow._agent_run_after_update'::regproc), 0) AS after_before,
       coalesce(pg_stat_get_xact_function_calls('runrow._agent_run_settings'::regproc), 0) AS settings_before,
       coalesce(pg_stat_get_xact_function_calls('runrow._agent_run_identity_guard'::regproc), 0) AS identity_before \gset
SELECT jsonb_agg(jsonb_build_object('run_id', c.run_id, 'claim_token', c.claim_token, 'status', 'completed')) AS acks
FROM runrow.claim_runs('w', 5) AS c \gset
SELECT results_eq(format('SELECT count(*) FILTER (WHERE finished) FROM runrow.finish_runs(%L)', :'acks'),
    $$VALUES (5::bigint)$$, 'a batch of five is claimed and finished');
SELECT is(array_agg(t.tgname || CASE WHEN cardinality(t.tgattr::int2[]) > 0 THEN ' (gated)' ELSE '' END
        ORDER BY t.tgname), ARRAY['agent_run_identity_guard (gated)', 'agent_run_settings (gated)'],
    'the row-level UPDATE triggers of agent_run are agent_run_identity_guard and agent_run_settings, '
    'each gated on columns no claim or ending assigns (the identity, what an enqueue sets)')
FROM pg_trigger AS t
WHERE t.tgrelid = 'runrow.agent_run'::regclass AND NOT t.tgisinternal
  AND (t.tgtype::int & 1) = 1 AND (t.tgtype::int & 16) = 16;
SELECT is(coalesce(pg_stat_get_xact_function_calls('runrow._agent_run_settings'::regproc), 0) - :settings_before,
    0::bigint, 'and claim_runs and finish_runs fire agent_run_settings for none of their rows');
SELECT is(coalesce(pg_stat_get_xact_function_calls('runrow._agent_run_identity_guard'::regproc), 0)
    - :identity_before, 0::bigint, 'nor agent_run_identity_guard');
SELECT is(coalesce(pg_stat_get_xact_function_calls('runrow._agent_run_after_update'::regproc), 0) - :after_before,
    2::bigint, 'turn order and the endings'' next turns are looked at once per statement (the claim''s, the '
    'finish''s), not once per run, and not for a promotion of delayed runs when none is due');

SELECT * FROM finish();
ROLLBACK;
