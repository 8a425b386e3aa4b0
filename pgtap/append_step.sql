-- runrow.append_step and the agent_step table: gap-free seqs, payload stored byte for
-- byte, the log always a valid conversation, append-only for every role (the owner too),
-- fenced out, bad input per argument.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/row_versions.psql
\ir helpers/steps.psql
SELECT plan(63);
SELECT pg_temp.drain_queue();

\set sig '''{uuid,uuid,text,json,text,jsonb,text,text,jsonb}'''
SELECT has_function('runrow', 'append_step', :sig::name[], 'append_step(run_id, claim_token, kind, payload, request_id, usage, stop_reason, stop_sequence, stop_details) exists');
SELECT is_definer('runrow', 'append_step', :sig::name[], 'append_step is SECURITY DEFINER');
SELECT function_privs_are('runrow', 'append_step', :sig::name[], 'runrow_worker', ARRAY['EXECUTE'], 'the worker may append steps');
SELECT function_privs_are('runrow', 'append_step', :sig::name[], 'runrow_client', ARRAY[]::name[], 'the client may not');
SELECT function_privs_are('runrow', 'append_step', :sig::name[], 'public', ARRAY[]::name[], 'PUBLIC may not');
SELECT col_type_is('runrow', 'agent_step', 'payload', 'json', 'payload is json, which keeps the text as written');

-- Happy path, as the worker role.
SELECT pg_temp.running() AS r1 \gset
SELECT pg_temp.token(:'r1') AS tok \gset
\set turn1 '''[ {"type":"thinking","thinking":"hmm","signature":"c2lnbmF0dXJl+/=="} ,\n {"type": "tool_use", "input": {"b":1, "a":"\\u00e9"}, "name":"lookup", "id":"tu_1"}]'''
SET LOCAL ROLE runrow_worker;
SELECT runrow.append_step(:'r1', :'tok', 'model_turn', :turn1::json, 'req_011',
    usage => '{"input_tokens": 12, "output_tokens": 7}', stop_reason => 'tool_use') AS s1 \gset
RESET ROLE;
SELECT is(:'s1'::int, 1, 'the first step of a run is seq 1');
SELECT is((SELECT payload::text FROM runrow.agent_step WHERE run_id = :'r1' AND seq = 1), :turn1,
    'the payload comes back byte for byte: whitespace, key order, \u escapes, newline');
SELECT is((SELECT (kind, request_id, attempt, usage ->> 'output_tokens', stop_reason)::text
    FROM runrow.agent_step WHERE run_id = :'r1' AND seq = 1),
    '(model_turn,req_011,1,7,tool_use)', 'kind, request_id, the attempt, usage and stop_reason are recorded');
SELECT is(runrow.append_step(:'r1', :'tok', 'tool_result',
    '{"type":"tool_result","tool_use_id":"tu_1","content":"found"}'), 2, 'a tool_result for that tool_use is seq 2');
SELECT is((SELECT tool_use_id FROM runrow.agent_step WHERE run_id = :'r1' AND seq = 2), 'tu_1',
    'the tool_result row names the tool_use it answers');
SELECT is(pg_temp.turn(:'r1', '[{"type":"text","text":"done"}]'), 3, 'once every tool_use is answered, a new model_turn is seq 3');
SELECT is(pg_temp.turn(:'r1', '[{"type":"text","text":"more"}]'), 4, 'a model_turn without tool_use may follow directly');
SELECT pg_temp.running() AS r2 \gset
SELECT is(pg_temp.turn(:'r2', '[{"type":"text","text":"other run"}]'), 1, 'seqs are per run');

-- The log stays a valid conversation.
SELECT pg_temp.tool_turn(:'r1', 'tu_2', 'lookup', '{}') AS s5 \gset
SELECT pg_temp.steps_written() AS before \gset
SELECT throws_ok(format('SELECT pg_temp.turn(%L, ''[{"type":"text","text":"x"}]'')', :'r1'), '55000',
    'kind: a new model_turn needs a tool_result for every tool_use of step 5 first; "tu_2" has none',
    'a model_turn while a tool_use has no result is refused');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''tool_result'', ''{"type":"tool_result","tool_use_id":"tu_1"}'')',
    :'r1', :'tok'), '22023', 'payload: tool_use_id "tu_1" is not a tool_use of the run''s latest model turn',
    'a tool_result for a tool_use of an earlier turn is refused');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''tool_result'', ''{"type":"tool_result","tool_use_id":"nope"}'')',
    :'r1', :'tok'), '22023', NULL, 'a tool_result for an unknown tool_use is refused');
SELECT is(pg_temp.steps_written(), :'before', 'refused appends wrote nothing');
SELECT runrow.append_step(:'r1', :'tok', 'tool_result', '{"type":"tool_result","tool_use_id":"tu_2","content":"x"}');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''tool_result'', ''{"type":"tool_result","tool_use_id":"tu_2"}'')',
    :'r1', :'tok'), '55000', 'payload: tool_use "tu_2" already has its tool_result', 'a second result for one tool_use is refused');

-- Fenced out: NULL and nothing written.
SELECT pg_temp.steps_written() AS before \gset
SELECT is(runrow.append_step(:'r1', gen_random_uuid(), 'model_turn', '[{"type":"text","text":"zombie"}]'), NULL,
    'a wrong token appends nothing and returns NULL');
SELECT runrow.finish_run(:'r2', pg_temp.token(:'r2'), 'completed');
SELECT pg_temp.steps_written() AS before2 \gset
SELECT is(runrow.append_step(:'r2', :'tok', 'model_turn', '[{"type":"text","text":"late"}]'), NULL,
    'a finished run takes no step');
SELECT is(runrow.append_step(gen_random_uuid(), :'tok', 'model_turn', '[{"type":"text","text":"?"}]'), NULL,
    'an unknown run takes no step');
SELECT is(pg_temp.steps_written(), :'before2', 'fenced-out appends wrote nothing');

-- Bad input: SQLSTATE, the argument named, nothing written.
SELECT pg_temp.steps_written() AS before \gset
\set ok_turn '''[{"type":"text","text":"x"}]'''
SELECT throws_ok(format('SELECT runrow.append_step(NULL, %L, ''model_turn'', %L)', :'tok', :ok_turn), '22004',
    'run_id must not be NULL', 'run_id NULL');
SELECT throws_ok(format('SELECT runrow.append_step(%L, NULL, ''model_turn'', %L)', :'r1', :ok_turn), '22004',
    'claim_token must not be NULL', 'claim_token NULL');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, NULL, %L)', :'r1', :'tok', :ok_turn), '22004',
    'kind must not be NULL', 'kind NULL');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''note'', %L)', :'r1', :'tok', :ok_turn), '22023',
    'kind must be model_turn or tool_result, got "note"', 'an unknown kind');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', NULL)', :'r1', :'tok'), '22004',
    'payload must not be NULL', 'payload NULL');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', ''{"type":"text"}'')', :'r1', :'tok'), '22023',
    'payload of a model_turn must be the non-empty array of the assistant message''s content blocks',
    'a model_turn payload that is not an array');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', ''[]'')', :'r1', :'tok'), '22023',
    NULL, 'an empty model_turn');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', ''[{"type":"text"}, {"text":"x"}]'')', :'r1', :'tok'),
    '22023', 'payload[1] must be a content block object with a string "type" (a tool_use also needs a string "id", '
    'a string "name" and an object "input")', 'a block without a type, named by index');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', ''[{"type":"tool_use","id":"t","name":"n"}]'')',
    :'r1', :'tok'), '22023', NULL, 'a tool_use without input');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''tool_result'', ''[{"type":"tool_result"}]'')', :'r1', :'tok'),
    '22023', 'payload of a tool_result must be one {"type": "tool_result", "tool_use_id": ...} block',
    'a tool_result that is not one block');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''tool_result'', ''{"type":"tool_result","tool_use_id":""}'')',
    :'r1', :'tok'), '22023', NULL, 'a tool_result with an empty tool_use_id');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', %L, '''')', :'r1', :'tok', :ok_turn), '22023',
    'request_id must be NULL or 1 to 255 characters', 'an empty request_id');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', %L, usage => ''[1]'')', :'r1', :'tok', :ok_turn),
    '22023', 'usage must be NULL or a JSON object, got array', 'usage that is not an object');
-- Usage the settlement and run_usage add up (1e30 was stored, and run_usage raised 22003 for
-- the run from then on; -5 was summed).
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', %L, usage => ''{"input_tokens": 1e30}'')',
    :'r1', :'tok', :ok_turn),
    '22023', 'usage.input_tokens must be a whole number of tokens from 0 to 10^15, got 1000000000000000000000000000000',
    'a token count past 10^15');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', %L, usage => %L)', :'r1', :'tok', :ok_turn,
    '{"input_tokens": 3, "output_tokens": -5}'),
    '22023', 'usage.output_tokens must be a whole number of tokens from 0 to 10^15, got -5', 'a negative token count');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', %L, usage => %L)', :'r1', :'tok', :ok_turn,
    '{"cache_read_input_tokens": 2.5}'),
    '22023', 'usage.cache_read_input_tokens must be a whole number of tokens from 0 to 10^15, got 2.5', 'a fraction');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', %L, usage => %L)', :'r1', :'tok', :ok_turn,
    '{"input_tokens": "7", "cache_creation_input_tokens": 1e16}'),
    '22023', 'usage.cache_creation_input_tokens must be a whole number of tokens from 0 to 10^15, got 10000000000000000',
    'a count past the clamp after one that is not a number (which counts 0, and passes)');
-- What a tool_use's later calls need: an id tool_effect can index, an id of its own in the turn,
-- input tool_call_key can walk. Each was taken, and made every later call for the turn fail.
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', %L)', :'r1', :'tok',
    json_build_array(json_build_object('type', 'tool_use', 'id', repeat('i', 257), 'name', 'n', 'input', '{}'::json))),
    '22023', 'payload[0].id is 257 characters: a tool_use id is at most 256', 'a tool_use id of 257 characters');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', %L)', :'r1', :'tok',
    '[{"type":"tool_use","id":"dup","name":"a","input":{}},{"type":"text","text":"and"},'
    '{"type":"tool_use","id":"dup","name":"b","input":{}}]'),
    '22023', 'payload[2].id "dup" is already payload[0]: each tool_use of a turn has an id of its own',
    'two tool_use blocks with one id');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', %L)', :'r1', :'tok',
    '[{"type":"tool\u005fuse","id":"dup","name":"a","input":{}},{"type":"tool_use","id":"dup","name":"b","input":{}}]'),
    '22023', 'payload[1].id "dup" is already payload[0]: each tool_use of a turn has an id of its own',
    'a type spelt with an escape (tool\u005fuse) is a tool_use all the same');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', %L)', :'r1', :'tok',
    '[{"type":"tool_use","id":"deep","name":"a","input":' || repeat('{"a":', 100) || '1' || repeat('}', 100) || '}]'),
    '22023', 'payload[0].input nests 100 levels deep or more: JSON clients cannot read it back (at most 99)',
    'a tool_use input nested 100 levels');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', %L, stop_reason => '''')', :'r1', :'tok', :ok_turn),
    '22023', 'stop_reason must be NULL or 1 to 64 characters', 'an empty stop_reason');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''tool_result'', ''{"type":"tool_result","tool_use_id":"x"}'', '
    'stop_reason => ''end_turn'')', :'r1', :'tok'),
    '22023', 'usage, stop_reason, stop_sequence and stop_details belong to a model_turn, not a tool_result',
    'stop_reason on a tool_result');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', %L)', :'r1', :'tok',
    '[{"type":"text","text":"' || repeat('x', 8388608) || '"}]'), '22023', NULL, 'a payload over 8 MiB');
SELECT is(pg_temp.steps_written(), :'before', 'bad input wrote nothing');

-- A NUL in the text is the escape \u0000, kept like any other escape. (JSON operators
-- raise 22P05 on it; the checks and tool_use_id read the payload with it as \ufffd.)
SELECT $j$[{"type":"text","text":"a\u0000b, not a NUL: \\u0000"},{"type":"tool_use","id":"tu_nul","name":"lookup","input":{"q":"x\u0000"}}]$j$
    AS nul_turn \gset
SET LOCAL ROLE runrow_worker;
SELECT is(runrow.append_step(:'r1', :'tok', 'model_turn', :'nul_turn', stop_reason => 'tool_use'), 7,
    'a model_turn whose text and tool input hold \u0000 is appended');
SELECT is(runrow.append_step(:'r1', :'tok', 'tool_result', '{"type":"tool_result","tool_use_id":"tu_nul","content":"got \u0000"}'), 8,
    'a tool_result whose content holds \u0000 answers its tool_use');
RESET ROLE;
SELECT is((SELECT payload::text FROM runrow.agent_step WHERE run_id = :'r1' AND seq = 7), :'nul_turn',
    'the payload comes back byte for byte: the \u0000 escape and an escaped backslash before u0000');
SELECT is((SELECT tool_use_id FROM runrow.agent_step WHERE run_id = :'r1' AND seq = 8), 'tu_nul',
    'the tool_result''s tool_use_id is derived from its payload');
SELECT is(pg_temp.turn(:'r1', '[{"type":"text","text":"after \u0000"}]'), 9,
    'a model_turn follows: the NUL turn''s tool_use counts as answered');
WITH forged AS (
    INSERT INTO runrow.agent_step (run_id, seq, kind, payload, tool_use_id, attempt)
    VALUES (:'r1', 10, 'tool_result', '{"type":"tool_result","tool_use_id":"tu_real"}', 'forged', 1)
    RETURNING tool_use_id
)
SELECT is((SELECT tool_use_id FROM forged), 'tu_real',
    'the owner''s INSERT cannot set tool_use_id: the trigger derives it from the payload');

-- Append-only from every role, the owner included.
SELECT throws_ok(format('UPDATE runrow.agent_step SET request_id = ''x'' WHERE run_id = %L', :'r1'), '23000',
    'agent_step is append-only: rows cannot be updated', 'the owner cannot update a step');
SELECT throws_ok(format('DELETE FROM runrow.agent_step WHERE run_id = %L', :'r1'), '23000',
    'agent_step is append-only: rows cannot be deleted', 'the owner cannot delete a step');
SELECT throws_ok('TRUNCATE runrow.agent_step CASCADE', '23000', NULL, 'nor truncate the step log');
SELECT throws_ok(format('INSERT INTO runrow.agent_step (run_id, seq, kind, payload, attempt) VALUES (%L, 9, ''model_turn'', ''[]'', 1)', :'r1'),
    '23000', NULL, 'a direct insert that skips a seq is refused');
SELECT throws_ok(format('INSERT INTO runrow.agent_step (run_id, seq, kind, payload, attempt) VALUES (%L, 1, ''model_turn'', ''[]'', 1)', :'r1'),
    '23000', NULL, 'a direct insert that reuses a seq is refused');
SELECT throws_ok(format('SELECT pg_temp.as_role(''runrow_worker'', %L)',
    format('INSERT INTO runrow.agent_step (run_id, seq, kind, payload, attempt) VALUES (%L, 7, ''model_turn'', ''[]'', 1)', :'r1')),
    '42501', NULL, 'the worker role cannot write the table directly');
SELECT throws_ok('SELECT pg_temp.as_role(''runrow_client'', ''SELECT 1 FROM runrow.agent_step'')', '42501', NULL,
    'the client role cannot read the table');
SELECT lives_ok('SELECT pg_temp.as_role(''runrow_auditor'', ''SELECT 1 FROM runrow.agent_step'')',
    'the auditor reads the step log');
SELECT is((SELECT array_agg(seq ORDER BY seq) FROM runrow.agent_step WHERE run_id = :'r1'), ARRAY[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
    'the log of the run is gap-free');

SELECT * FROM finish();
ROLLBACK;
