-- runrow.append_events: contiguous seqs after the existing journal, payloads verbatim,
-- the last seq returned; reserved and malformed events rejected by index; fenced out
-- (wrong token, finished, reaped) returns NULL and writes nothing.
BEGIN;
\ir helpers/setup.psql
\ir helpers/row_versions.psql
SELECT plan(50);
SELECT pg_temp.drain_queue();

\set sig '''{uuid,uuid,jsonb}'''
SELECT has_function('runrow', 'append_events', :sig::name[], 'append_events(run_id, claim_token, events) exists');
SELECT is_definer('runrow', 'append_events', :sig::name[], 'append_events is SECURITY DEFINER');
SELECT function_privs_are('runrow', 'append_events', :sig::name[], 'runrow_worker', ARRAY['EXECUTE'],
    'runrow_worker may append');
SELECT function_privs_are('runrow', 'append_events', :sig::name[], 'runrow_client', ARRAY[]::name[],
    'runrow_client may not append');
SELECT function_privs_are('runrow', 'append_events', :sig::name[], 'public', ARRAY[]::name[],
    'PUBLIC may not append');

-- Happy path: the journal already holds seqs 1..3 (queued, claimed).
SELECT pg_temp.new_run() AS r1 \gset
SELECT pg_temp.claim(:'r1') AS tok \gset
SELECT is((SELECT max(seq) FROM runrow.run_event WHERE run_id = :'r1'), 3::bigint, 'a claimed run''s journal ends at seq 3');
SET LOCAL ROLE runrow_worker;
SELECT runrow.append_events(run_id => :'r1', claim_token => :'tok', events => $$[
    {"type": "text_delta", "text": "Hel"},
    {"type": "text_delta", "text": "lo", "index": 0},
    {"type": "tool_use", "id": "tu_1", "input": {"q": ["a", {"b": null}]}}
]$$) AS last1 \gset
RESET ROLE;
SELECT is(:'last1'::bigint, 6::bigint, 'returns the last seq written');
SELECT results_eq(
    format('SELECT seq, type, payload FROM runrow.run_event WHERE run_id = %L AND seq > 3 ORDER BY seq', :'r1'),
    $$VALUES (4::bigint, 'text_delta'::text, '{"type": "text_delta", "text": "Hel"}'::jsonb),
             (5, 'text_delta', '{"type": "text_delta", "text": "lo", "index": 0}'),
             (6, 'tool_use', '{"type": "tool_use", "id": "tu_1", "input": {"q": ["a", {"b": null}]}}')$$,
    'the events get seqs 4, 5, 6 in array order; type extracted, the whole object stored as payload');
SELECT is(runrow.append_events(:'r1', :'tok', '[{"type": "text_delta", "text": "!"}]'), 7::bigint,
    'a second call continues at the next seq');
SELECT is(runrow.append_events(:'r1', :'tok', '[{"type": "runner_note"}, {"type": "rundown"}, {"type": "completed"}]'),
    10::bigint, 'types that only look like reserved ones (runner_note, rundown, completed) are accepted');
SELECT is(
    (SELECT array_agg(seq ORDER BY seq) FROM runrow.run_event WHERE run_id = :'r1'),
    ARRAY[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]::bigint[], 'the journal is contiguous from 1');
SELECT is(
    runrow.append_events(:'r1', :'tok', (SELECT jsonb_agg(jsonb_build_object('type', 'delta', 'i', g))
                                         FROM generate_series(1, 1000) AS g)),
    1010::bigint, 'exactly 1000 events in one call are accepted');
SELECT is(
    (SELECT (payload ->> 'i')::int FROM runrow.run_event WHERE run_id = :'r1' AND seq = 1010), 1000,
    'in order: the 1000th event is at seq 1010');

-- A run with a stop pending is still the worker's: it keeps journaling the partial output.
SELECT a.conversation_id AS conv FROM runrow.agent_run AS a WHERE a.id = :'r1' \gset
SELECT is((SELECT action FROM runrow.stop_conversation(:'conv')), 'cancel_requested', 'a stop is requested');
SELECT is(runrow.append_events(:'r1', :'tok', '[{"type": "text_delta", "text": "partial"}]'), 1012::bigint,
    'appends still land while cancel is requested (after the cancel_requested event at 1011)');

-- A lapsed lease is not a fence by itself: the owner appends until a reaper ends the run.
SELECT pg_temp.expire(:'r1', 120);
SELECT is(runrow.append_events(:'r1', :'tok', '[{"type": "text_delta", "text": "late"}]'), 1013::bigint,
    'an append after the lease lapsed, before any reap, still lands');
SELECT ok(runrow.heartbeat(:'r1', :'tok') IS NOT NULL, 'the worker heartbeats again');

-- Fenced out: wrong token, unknown run. NULL, nothing written.
SELECT pg_temp.written() AS before \gset
SELECT is(runrow.append_events(:'r1', gen_random_uuid(), '[{"type": "text_delta"}]'), NULL::bigint,
    'a wrong token returns NULL');
SELECT is(runrow.append_events(gen_random_uuid(), :'tok', '[{"type": "text_delta"}]'), NULL::bigint,
    'an unknown run returns NULL');
SELECT is(pg_temp.written(), :'before', 'neither wrote anything');

-- Fenced out: a finished run.
SELECT ok(runrow.finish_run(:'r1', :'tok', 'cancelled'), 'the run is finished');
SELECT pg_temp.written() AS before \gset
SELECT is(runrow.append_events(:'r1', :'tok', '[{"type": "text_delta"}]'), NULL::bigint,
    'an append after finish returns NULL');
SELECT is(pg_temp.written(), :'before', 'and writes nothing after the complete event');

-- Fenced out: a reaped run (requeued), and after someone else claimed it.
SELECT pg_temp.new_run(attempts => 2) AS r2 \gset
SELECT pg_temp.claim(:'r2') AS tok2 \gset
SELECT pg_temp.expire(:'r2');
SELECT is((SELECT outcome FROM runrow.reap_expired_runs(0) WHERE run_id = :'r2'), 'requeued', 'r2 is reaped');
SELECT pg_temp.written() AS before \gset
SELECT is(runrow.append_events(:'r2', :'tok2', '[{"type": "text_delta"}]'), NULL::bigint,
    'the zombie''s append after the reap returns NULL');
SELECT is(pg_temp.written(), :'before', 'and writes nothing');
SELECT pg_temp.claim(:'r2') AS tok3 \gset
SELECT pg_temp.written() AS before \gset
SELECT is(runrow.append_events(:'r2', :'tok2', '[{"type": "text_delta"}]'), NULL::bigint,
    'the zombie''s old token stays fenced out after the re-claim');
SELECT is(pg_temp.written(), :'before', 'and writes nothing');
SELECT ok(runrow.append_events(:'r2', :'tok3', '[{"type": "text_delta"}]') IS NOT NULL, 'the new token appends');

-- Bad input: each argument, the reason, the index of the bad event; nothing written.
\set msg '] must be an object with a non-empty string "type" that is not reserved ("complete" and "run_*" are written by runrow itself) and has no control character'
SELECT pg_temp.written() AS before \gset
SELECT throws_ok(format('SELECT runrow.append_events(NULL, %L, ''[{"type": "x"}]'')', :'tok3'), '22004',
    'run_id must not be NULL', 'run_id NULL');
SELECT throws_ok(format('SELECT runrow.append_events(%L, NULL, ''[{"type": "x"}]'')', :'r2'), '22004',
    'claim_token must not be NULL', 'claim_token NULL');
SELECT throws_ok(format('SELECT runrow.append_events(%L, %L, NULL)', :'r2', :'tok3'), '22004',
    'events must not be NULL', 'events NULL');
SELECT throws_ok(format('SELECT runrow.append_events(%L, %L, ''{"type": "x"}'')', :'r2', :'tok3'), '22023',
    'events must be a JSON array of event objects, got object', 'events a single object, not an array');
SELECT throws_ok(format('SELECT runrow.append_events(%L, %L, ''"x"'')', :'r2', :'tok3'), '22023',
    'events must be a JSON array of event objects, got string', 'events a string');
SELECT throws_ok(format('SELECT runrow.append_events(%L, %L, ''[]'')', :'r2', :'tok3'), '22023',
    'events must not be empty', 'events empty');
SELECT throws_ok(
    format('SELECT runrow.append_events(%L, %L, (SELECT jsonb_agg(jsonb_build_object(''type'', ''d''))
            FROM generate_series(1, 1001)))', :'r2', :'tok3'), '22023',
    'events is too large: at most 1000 events and 4 MiB per call', '1001 events');
SELECT throws_ok(
    format('SELECT runrow.append_events(%L, %L, jsonb_build_array(jsonb_build_object(''type'', ''d'',
            ''text'', repeat(''x'', 4194304))))', :'r2', :'tok3'), '22023',
    'events is too large: at most 1000 events and 4 MiB per call', 'events over 4 MiB');
SELECT throws_ok(format('SELECT runrow.append_events(%L, %L, ''["text_delta"]'')', :'r2', :'tok3'), '22023',
    'events[0' || :'msg', 'events[0] not an object');
SELECT throws_ok(format('SELECT runrow.append_events(%L, %L, ''[{"type": "a"}, {"text": "no type"}]'')', :'r2', :'tok3'),
    '22023', 'events[1' || :'msg', 'events[1] without a type');
SELECT throws_ok(format('SELECT runrow.append_events(%L, %L, ''[{"type": "a"}, {"type": "b"}, {"type": 3}]'')', :'r2', :'tok3'),
    '22023', 'events[2' || :'msg', 'events[2] with a non-string type');
SELECT throws_ok(format('SELECT runrow.append_events(%L, %L, ''[{"type": ""}]'')', :'r2', :'tok3'), '22023',
    'events[0' || :'msg', 'an empty type');
SELECT throws_ok(format('SELECT runrow.append_events(%L, %L, ''[{"type": "a"}, {"type": "complete"}]'')', :'r2', :'tok3'),
    '22023', 'events[1' || :'msg', 'the reserved type complete');
SELECT throws_ok(format('SELECT runrow.append_events(%L, %L, ''[{"type": "run_claimed"}]'')', :'r2', :'tok3'),
    '22023', 'events[0' || :'msg', 'a reserved run_* type');
-- A control character in a type: a line break forges an SSE frame, an escape rewrites a terminal.
SELECT throws_ok(format('SELECT runrow.append_events(%L, %L, ''[{"type": "a"}, {"type": "comp\r\nlete"}]'')', :'r2', :'tok3'),
    '22023', 'events[1' || :'msg', 'a type with a line break');
SELECT throws_ok(format('SELECT runrow.append_events(%L, %L, ''[{"type": "x\u001b]52;c;AA\u0007"}]'')', :'r2', :'tok3'),
    '22023', 'events[0' || :'msg', 'a type with a terminal escape');
SELECT throws_ok(format('SELECT runrow.append_events(%L, %L, ''[{"type": "x\u0085y"}]'')', :'r2', :'tok3'),
    '22023', 'events[0' || :'msg', 'a type with a C1 control (NEL)');
SELECT ok(runrow.append_events(:'r2', :'tok3', '[{"type": "tool.ü:日本-_x"}]') IS NOT NULL,
    'a type of letters beyond ASCII and punctuation is not a control character');
SELECT pg_temp.written() AS before \gset
SELECT throws_ok(format('SELECT runrow.append_events(%L, %L, ''[{"type": "a"}, null]'')', :'r2', :'tok3'),
    '22023', 'events[1' || :'msg', 'a JSON null event');
SELECT throws_ok(format('SELECT runrow.append_events(%L, %L, ''[{"type": "run_x"}]'')', :'r2', gen_random_uuid()),
    '22023', 'events[0' || :'msg', 'bad input is reported even with a stale token');
SELECT is(pg_temp.written(), :'before', 'bad input wrote nothing: no partial batch');

SELECT * FROM finish();
ROLLBACK;
