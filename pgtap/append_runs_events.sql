-- runrow.append_runs_events: the events of many running runs in one call. Each run is
-- fenced on its own exactly as append_events (a fenced-out run writes nothing and comes back
-- NULL, the others proceed), its events land at its next seqs as append_events would write
-- them, the runs keep running; bad input of each kind names the element and writes nothing.
-- (Its wakes are delivered on commit: tests/test_append_runs_events.py, with LISTEN.)
BEGIN;
\ir helpers/setup.psql
\ir helpers/row_versions.psql
\ir helpers/lifecycle.psql
SELECT plan(42);
SELECT pg_temp.drain_queue();

\set sig '''{jsonb}'''
SELECT has_function('runrow', 'append_runs_events', :sig::name[], 'append_runs_events(runs) exists');
SELECT is_definer('runrow', 'append_runs_events', :sig::name[], 'append_runs_events is SECURITY DEFINER');
SELECT function_privs_are('runrow', 'append_runs_events', :sig::name[], 'runrow_worker', ARRAY['EXECUTE'],
    'runrow_worker may append');
SELECT function_privs_are('runrow', 'append_runs_events', :sig::name[], 'runrow_client', ARRAY[]::name[],
    'runrow_client may not append');
SELECT function_privs_are('runrow', 'append_runs_events', :sig::name[], 'public', ARRAY[]::name[],
    'PUBLIC may not append');
SELECT isnt(obj_description('runrow.append_runs_events(jsonb)'::regprocedure, 'pg_proc'), NULL,
    'append_runs_events has a COMMENT stating its contract');

-- Happy path: three running runs, one to three events each.
SELECT pg_temp.running() AS h1 \gset
SELECT pg_temp.running() AS h2 \gset
SELECT pg_temp.running() AS h3 \gset
SELECT count(*) AS n1 FROM runrow.run_event WHERE run_id = :'h1' \gset
SELECT count(*) AS n2 FROM runrow.run_event WHERE run_id = :'h2' \gset
SELECT count(*) AS n3 FROM runrow.run_event WHERE run_id = :'h3' \gset
SELECT jsonb_build_array(
    jsonb_build_object('run_id', :'h1', 'claim_token', pg_temp.token(:'h1'),
        'events', '[{"type": "text_delta", "index": 0, "text": "h"}, {"type": "text_delta", "index": 0, "text": "i"}]'::jsonb),
    jsonb_build_object('run_id', :'h2', 'claim_token', pg_temp.token(:'h2'),
        'events', '[{"type": "message_start", "role": "assistant"}]'::jsonb),
    jsonb_build_object('run_id', :'h3', 'claim_token', pg_temp.token(:'h3'),
        'events', '[{"type": "tool_use", "name": "x"}, {"type": "x"}, {"type": "y", "n": 1}]'::jsonb)) AS batch1 \gset
SET LOCAL ROLE runrow_worker;
CREATE TEMP TABLE app1 AS SELECT row_number() OVER () AS n, * FROM runrow.append_runs_events(:'batch1');
RESET ROLE;
SELECT results_eq('SELECT n::int, run_id, last_seq FROM app1 ORDER BY n',
    format($$VALUES (1, %L::uuid, %s::bigint), (2, %L::uuid, %s::bigint), (3, %L::uuid, %s::bigint)$$,
        :'h1', :'n1'::int + 2, :'h2', :'n2'::int + 1, :'h3', :'n3'::int + 3),
    'one row per element in input order, with the last seq written');
SELECT results_eq(
    format('SELECT seq, type, payload FROM runrow.run_event WHERE run_id = %L AND seq > %s ORDER BY seq', :'h1', :'n1'),
    format($$VALUES (%s::bigint, 'text_delta'::text, '{"type": "text_delta", "index": 0, "text": "h"}'::jsonb),
                    (%s, 'text_delta', '{"type": "text_delta", "index": 0, "text": "i"}')$$,
        :'n1'::int + 1, :'n1'::int + 2),
    'h1: its events at the next seqs, in array order');
SELECT is((SELECT array_agg(type ORDER BY seq)::text FROM runrow.run_event WHERE run_id = :'h3' AND seq > :'n3'),
    '{tool_use,x,y}', 'h3: its three events in order');
SELECT results_eq(
    format($$SELECT status, claim_token IS NOT NULL FROM runrow.agent_run
             WHERE id = ANY (ARRAY[%L, %L, %L]::uuid[])$$, :'h1', :'h2', :'h3'),
    $$VALUES ('running'::text, true), ('running', true), ('running', true)$$,
    'the runs keep running with their claims');

-- The journal is the one append_events writes: the same events, one run each way.
SELECT pg_temp.running() AS single \gset
SELECT pg_temp.running() AS batched \gset
\set events '''[{"type": "message_start"}, {"type": "text_delta", "text": "x\\u00e9y"}, {"type": "message_stop"}]'''
SELECT runrow.append_events(:'single', pg_temp.token(:'single'), :events) AS s_seq \gset
SELECT is((SELECT last_seq FROM runrow.append_runs_events(jsonb_build_array(jsonb_build_object(
    'run_id', :'batched', 'claim_token', pg_temp.token(:'batched'), 'events', :events::jsonb)))), :'s_seq'::bigint,
    'the same last seq as append_events gives');
SELECT results_eq(
    format($$SELECT seq, type, payload FROM runrow.run_event WHERE run_id = %L
             AND seq > (SELECT seq FROM runrow.run_event WHERE run_id = %L AND type = 'run_claimed') ORDER BY seq$$,
        :'batched', :'batched'),
    format($$SELECT seq, type, payload FROM runrow.run_event WHERE run_id = %L
             AND seq > (SELECT seq FROM runrow.run_event WHERE run_id = %L AND type = 'run_claimed') ORDER BY seq$$,
        :'single', :'single'),
    'and the same journal rows after run_claimed');
SELECT is_empty(format($$SELECT * FROM runrow.audit() WHERE run_id = ANY (ARRAY[%L, %L, %L, %L]::uuid[])$$,
    :'h1', :'h2', :'h3', :'batched'), 'audit finds nothing wrong with the runs (seqs gap-free)');

-- An empty batch: no rows, nothing written.
SELECT pg_temp.written() AS before \gset
SELECT is_empty('SELECT * FROM runrow.append_runs_events(''[]'')', 'an empty batch returns no rows');
SELECT is(pg_temp.written(), :'before', 'and writes nothing');

-- Fenced out among good ones: a wrong token, a finished run, an unknown run, a run reaped
-- and requeued (old token). Each writes nothing and comes back NULL; the others proceed.
SELECT pg_temp.running() AS g1 \gset
SELECT pg_temp.running() AS wrongtok \gset
SELECT pg_temp.finished() AS done \gset
SELECT pg_temp.running(attempts => 2) AS requeued \gset
SELECT pg_temp.running() AS g2 \gset
SELECT pg_temp.token(:'requeued') AS oldtok \gset
SELECT pg_temp.expire(:'requeued');
SELECT is((SELECT outcome FROM runrow.reap_expired_runs(0) WHERE run_id = :'requeued'), 'requeued', 'requeued is reaped');
SELECT md5(string_agg(a.ctid::text || coalesce(a.claim_token::text, ''), ',' ORDER BY a.id)) AS fenced_rows
FROM runrow.agent_run AS a WHERE a.id = ANY (ARRAY[:'wrongtok', :'done', :'requeued']::uuid[]) \gset
SELECT count(*) AS fenced_events FROM runrow.run_event WHERE run_id = ANY (ARRAY[:'wrongtok', :'done', :'requeued']::uuid[]) \gset
\set unknown '''00000000-0000-0000-0000-00000000dead'''
\set one '''[{"type": "text_delta", "text": "z"}]'''
SELECT jsonb_build_array(
    jsonb_build_object('run_id', :'g1', 'claim_token', pg_temp.token(:'g1'), 'events', :one::jsonb),
    jsonb_build_object('run_id', :'wrongtok', 'claim_token', gen_random_uuid(), 'events', :one::jsonb),
    jsonb_build_object('run_id', :'done', 'claim_token', gen_random_uuid(), 'events', :one::jsonb),
    jsonb_build_object('run_id', :unknown, 'claim_token', gen_random_uuid(), 'events', :one::jsonb),
    jsonb_build_object('run_id', :'requeued', 'claim_token', :'oldtok', 'events', :one::jsonb),
    jsonb_build_object('run_id', :'g2', 'claim_token', pg_temp.token(:'g2'), 'events', :one::jsonb)) AS batch2 \gset
SET LOCAL ROLE runrow_worker;
CREATE TEMP TABLE app2 AS SELECT row_number() OVER () AS n, * FROM runrow.append_runs_events(:'batch2');
RESET ROLE;
SELECT results_eq('SELECT n::int, run_id, last_seq IS NOT NULL FROM app2 ORDER BY n',
    format($$VALUES (1, %L::uuid, true), (2, %L::uuid, false), (3, %L::uuid, false),
                    (4, %L::uuid, false), (5, %L::uuid, false), (6, %L::uuid, true)$$,
        :'g1', :'wrongtok', :'done', :unknown, :'requeued', :'g2'),
    'fenced-out runs come back with last_seq NULL; the others with their last seq');
SELECT is((SELECT md5(string_agg(a.ctid::text || coalesce(a.claim_token::text, ''), ',' ORDER BY a.id))
           FROM runrow.agent_run AS a WHERE a.id = ANY (ARRAY[:'wrongtok', :'done', :'requeued']::uuid[])),
    :'fenced_rows', 'the fenced-out run rows were not touched (same row versions)');
SELECT is((SELECT count(*) FROM runrow.run_event WHERE run_id = ANY (ARRAY[:'wrongtok', :'done', :'requeued']::uuid[])),
    :'fenced_events'::bigint, 'and nothing was journaled for them');
SELECT is(pg_temp.last_event(:'g2') ->> 'text', 'z', 'g2, after the fenced-out ones, got its event');
SELECT pg_temp.written() AS before \gset
SELECT is((SELECT count(*) FROM runrow.append_runs_events(jsonb_build_array(
        jsonb_build_object('run_id', :'wrongtok', 'claim_token', gen_random_uuid(), 'events', :one::jsonb),
        jsonb_build_object('run_id', :'done', 'claim_token', gen_random_uuid(), 'events', :one::jsonb)))
    WHERE last_seq IS NULL), 2::bigint, 'a batch of fenced-out runs only: every row NULL');
SELECT is(pg_temp.written(), :'before', 'and not a row version written anywhere');
SELECT pg_temp.claim(:'requeued') AS newtok \gset
SELECT is((SELECT last_seq IS NOT NULL FROM runrow.append_runs_events(jsonb_build_array(
        jsonb_build_object('run_id', :'requeued', 'claim_token', :'newtok', 'events', :one::jsonb)))), true,
    'the requeued run, claimed again, appends under its new token');

-- Bad input of each kind: an error naming the element and the field, nothing written, not
-- even the good element before the bad one.
SELECT pg_temp.running() AS b1 \gset
SELECT pg_temp.running() AS b2 \gset
SELECT jsonb_build_object('run_id', :'b2', 'claim_token', pg_temp.token(:'b2'), 'events', :one::jsonb) AS good2 \gset
SELECT set_config('tap.b1', :'b1', true) AS b1_setting \gset
CREATE FUNCTION pg_temp.batch(second jsonb) RETURNS text LANGUAGE sql AS $$
    SELECT format('SELECT * FROM runrow.append_runs_events(%L::jsonb)', jsonb_build_array(
        (SELECT jsonb_build_object('run_id', id, 'claim_token', claim_token, 'events', '[{"type": "x"}]'::jsonb)
         FROM runrow.agent_run WHERE id = current_setting('tap.b1')::uuid), second))
$$;
SELECT pg_temp.written() AS before \gset
SELECT throws_ok('SELECT * FROM runrow.append_runs_events(NULL)', '22004', 'runs must not be NULL', 'runs NULL');
SELECT throws_ok('SELECT * FROM runrow.append_runs_events(''{"run_id": 1}'')', '22023',
    'runs must be a JSON array of run objects, got object', 'runs an object, not an array');
SELECT throws_ok(format('SELECT * FROM runrow.append_runs_events(%L)',
        (SELECT jsonb_agg(:'good2'::jsonb) FROM generate_series(1, 1001))), '22023',
    'runs is too large: at most 1000 runs per call, got 1001', 'more than 1000 runs');
SELECT throws_ok(pg_temp.batch('"x"'), '22023', 'runs[1] must be a JSON object, got string', 'an element not an object');
SELECT throws_ok(pg_temp.batch(:'good2'::jsonb || '{"status": "completed"}'), '22023',
    'runs[1] has an unknown key "status" (allowed: run_id, claim_token, events)',
    'an unknown key (an ending goes to finish_runs, not silently dropped)');
SELECT throws_ok(pg_temp.batch(:'good2'::jsonb - 'run_id'), '22004', 'runs[1].run_id must not be NULL', 'run_id missing');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{run_id}', '"not-a-uuid"')), '22023',
    'runs[1].run_id must be a UUID string, got "not-a-uuid"', 'run_id not a UUID');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{claim_token}', 'null')), '22004',
    'runs[1].claim_token must not be NULL', 'claim_token null');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{claim_token}', '7')), '22023',
    'runs[1].claim_token must be a UUID string, got 7', 'claim_token a number');
SELECT throws_ok(pg_temp.batch(:'good2'::jsonb - 'events'), '22004', 'runs[1].events must not be NULL', 'events missing');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{events}', '{"type": "x"}')), '22023',
    'runs[1].events must be a JSON array of event objects, got object', 'events an object, not an array');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{events}', '[]')), '22023',
    'runs[1].events must not be empty', 'events empty (as append_events)');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{events}',
        (SELECT jsonb_agg('{"type": "x"}'::jsonb) FROM generate_series(1, 1001)))), '22023',
    'runs[1].events is too large: at most 1000 events and 4 MiB per run', 'more than 1000 events for a run');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{events}', '[{"type": "x"}, {"type": "x"}, {"text": "no type"}]')),
    '22023', 'runs[1].events[2] must be an object with a non-empty string "type" that is not reserved '
    '("complete" and "run_*" are written by runrow itself) and has no control character', 'an event without a type, named by its index');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{events}', '[{"type": "complete"}]')), '22023',
    'runs[1].events[0] must be an object with a non-empty string "type" that is not reserved '
    '("complete" and "run_*" are written by runrow itself) and has no control character', 'a reserved type (complete)');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{events}', '[{"type": "run_claimed"}]')), '22023',
    'runs[1].events[0] must be an object with a non-empty string "type" that is not reserved '
    '("complete" and "run_*" are written by runrow itself) and has no control character', 'a reserved type (run_*)');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{events}', '[{"type": "x"}, {"type": "a\nb"}]')), '22023',
    'runs[1].events[1] must be an object with a non-empty string "type" that is not reserved '
    '("complete" and "run_*" are written by runrow itself) and has no control character', 'a type with a line break');
SELECT throws_ok(pg_temp.batch(jsonb_set(:'good2'::jsonb, '{run_id}', to_jsonb(upper(:'b1')))), '22023',
    format('runs[1].run_id "%s" is already runs[0]: each run at most once per call', upper(:'b1')),
    'the same run twice (whatever the case of its id)');
SELECT is(pg_temp.written(), :'before', 'none of the refused calls wrote anything, not even runs[0]');

SELECT * FROM finish();
ROLLBACK;
