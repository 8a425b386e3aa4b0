-- runrow.complete_tool_call: the result and its tool_result step in one transaction,
-- content forms (an array only when it holds content blocks), immutable results, rejections, wrong states, fenced out, bad input.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/row_versions.psql
\ir helpers/steps.psql
SELECT plan(51);
SELECT pg_temp.drain_queue();

\set sig '''{uuid,uuid,text,jsonb,boolean}'''
SELECT has_function('runrow', 'complete_tool_call', :sig::name[], 'complete_tool_call(run_id, claim_token, idempotency_key, result, is_error) exists');
SELECT is_definer('runrow', 'complete_tool_call', :sig::name[], 'complete_tool_call is SECURITY DEFINER');
SELECT function_privs_are('runrow', 'complete_tool_call', :sig::name[], 'runrow_worker', ARRAY['EXECUTE'], 'the worker may complete tool calls');
SELECT function_privs_are('runrow', 'complete_tool_call', :sig::name[], 'runrow_client', ARRAY[]::name[], 'the client may not');
SELECT function_privs_are('runrow', 'complete_tool_call', :sig::name[], 'public', ARRAY[]::name[], 'PUBLIC may not');

SELECT pg_temp.running() AS r \gset
SELECT pg_temp.token(:'r') AS tok \gset
-- One model turn with four parallel tool calls.
SELECT pg_temp.turn(:'r', '[{"type":"tool_use","id":"tu_s","name":"a","input":{}},{"type":"tool_use","id":"tu_l","name":"b","input":{}},'
    '{"type":"tool_use","id":"tu_o","name":"c","input":{}},{"type":"tool_use","id":"tu_e","name":"d","input":{}}]');
SELECT pg_temp.key(:'r', 1, 'tu_s', 'a', '{}') AS ks, pg_temp.key(:'r', 1, 'tu_l', 'b', '{}') AS kl,
       pg_temp.key(:'r', 1, 'tu_o', 'c', '{}') AS ko, pg_temp.key(:'r', 1, 'tu_e', 'd', '{}') AS ke \gset
SELECT pg_temp.begin(:'r', :'tok', :'ks', 'a', '{}', 'pure'), pg_temp.begin(:'r', :'tok', :'kl', 'b', '{}', 'idempotent'),
       pg_temp.begin(:'r', :'tok', :'ko', 'c', '{}', 'non_idempotent'), pg_temp.begin(:'r', :'tok', :'ke', 'd', '{}', 'pure');

SET LOCAL ROLE runrow_worker;
SELECT runrow.complete_tool_call(:'r', :'tok', :'ks', '"3 hits"') AS seq_s \gset
RESET ROLE;
SELECT is(:'seq_s'::int, 2, 'returns the seq of the tool_result step it appended');
SELECT is((SELECT (kind, payload::text)::text FROM runrow.agent_step WHERE run_id = :'r' AND seq = 2),
    '(tool_result,"{""type"":""tool_result"",""tool_use_id"":""tu_s"",""content"":""3 hits"",""is_error"":false}")',
    'a string result is the block''s content');
SELECT is((SELECT (state, result, is_error, result_step_seq, completed_at = now())::text FROM runrow.tool_effect WHERE idempotency_key = :'ks'),
    '(done,"""3 hits""",f,2,t)', 'the effect is done with its result and step');
SELECT is(runrow.complete_tool_call(:'r', :'tok', :'kl', '[{"type":"text","text":"x"}]'), 3, 'an array result');
SELECT is((SELECT payload::text FROM runrow.agent_step WHERE run_id = :'r' AND seq = 3),
    '{"type":"tool_result","tool_use_id":"tu_l","content":[{"text": "x", "type": "text"}],"is_error":false}',
    'an array result is the block''s content (content blocks)');
SELECT is(runrow.complete_tool_call(:'r', :'tok', :'ko', '{"charge": "ch_1", "n": 2}'), 4, 'an object result');
SELECT is((SELECT payload::text FROM runrow.agent_step WHERE run_id = :'r' AND seq = 4),
    '{"type":"tool_result","tool_use_id":"tu_o","content":"{\"n\": 2, \"charge\": \"ch_1\"}","is_error":false}',
    'any other result reaches the model as its JSON text');
SELECT is(runrow.complete_tool_call(:'r', :'tok', :'ke', '"timeout"', true), 5, 'an error result');
SELECT is((SELECT payload::text FROM runrow.agent_step WHERE run_id = :'r' AND seq = 5),
    '{"type":"tool_result","tool_use_id":"tu_e","content":"timeout","is_error":true}', 'is_error reaches the block');
SELECT is((SELECT array_agg(DISTINCT message_index) FROM runrow.conversation_history(
        (SELECT conversation_id FROM runrow.agent_run WHERE id = :'r'), :'r') WHERE kind = 'tool_result'),
    ARRAY[3], 'the four results of one model turn form one user message in the history');

-- The same complete again (its first commit unheard): same seq, nothing written.
SELECT pg_temp.steps_written() AS before \gset
SELECT is(runrow.complete_tool_call(:'r', :'tok', :'ks', '"3 hits"'), 2, 'repeating the same result returns the same seq');
SELECT is(pg_temp.steps_written(), :'before', 'and writes nothing');
SELECT throws_ok(format('SELECT runrow.complete_tool_call(%L, %L, %L, ''"4 hits"'')', :'r', :'tok', :'ks'), '55000',
    'idempotency_key already has a different result recorded (step 2); results never change', 'a different result is refused');

-- Immutable for every role, the owner included.
SELECT throws_ok(format('UPDATE runrow.tool_effect SET result = ''"edited"'' WHERE idempotency_key = %L', :'ks'), '23000',
    format('tool_effect %s: the result is recorded and immutable', :'ks'), 'the owner cannot edit a recorded result');
SELECT throws_ok(format('DELETE FROM runrow.tool_effect WHERE idempotency_key = %L', :'ks'), '23000', NULL,
    'nor delete an effect');
SELECT throws_ok('TRUNCATE runrow.tool_effect', '23000', NULL, 'nor truncate the table');
SELECT throws_ok('SELECT pg_temp.as_role(''runrow_worker'', ''UPDATE runrow.tool_effect SET is_error = true'')', '42501', NULL,
    'the worker role has no direct write');
SELECT lives_ok('SELECT pg_temp.as_role(''runrow_auditor'', ''SELECT 1 FROM runrow.tool_effect'')', 'the auditor reads effects');

-- One transaction: when the step cannot be appended, no result is recorded either.
SELECT pg_temp.tool_turn(:'r', 'tu_x', 'x', '{}') AS sx \gset
SELECT pg_temp.key(:'r', :sx, 'tu_x', 'x', '{}') AS kx \gset
SELECT pg_temp.begin(:'r', :'tok', :'kx', 'x', '{}', 'non_idempotent');
INSERT INTO runrow.agent_step (run_id, seq, kind, payload, attempt)
VALUES (:'r', :sx + 1, 'tool_result', '{"type":"tool_result","tool_use_id":"tu_x"}', 1);
SELECT throws_ok(format('SELECT runrow.complete_tool_call(%L, %L, %L, ''"r"'')', :'r', :'tok', :'kx'), '23505', NULL,
    'a result whose step cannot be appended fails');
SELECT is(pg_temp.effect_state(:'kx'), 'executing', 'and leaves the effect without a result');

-- Wrong states: only executing (or rejected) calls take a result.
SELECT pg_temp.running() AS r2 \gset
SELECT pg_temp.tool_turn(:'r2', 'tu_i', 'wipe', '{}') AS si \gset
SELECT pg_temp.key(:'r2', :si, 'tu_i', 'wipe', '{}') AS ki \gset
SELECT pg_temp.begin(:'r2', pg_temp.token(:'r2'), :'ki', 'wipe', '{}', 'irreversible');
SELECT runrow.resolve_approval(:'ki', false, 'dora', 'not today');
SELECT pg_temp.claim(:'r2') AS tok2 \gset
SELECT pg_temp.steps_written() AS before \gset
SELECT throws_ok(format('SELECT runrow.complete_tool_call(%L, %L, %L, ''"x"'')', :'r2', :'tok2', pg_temp.key(:'r2', :si, 'tu_i', 'other', '{}')),
    '22023', 'idempotency_key is not a tool call of this run: call begin_tool_call first', 'a key never begun');
SELECT throws_ok(format('SELECT runrow.complete_tool_call(%L, %L, %L, ''"x"'')', :'r2', :'tok2', :'ks'),
    '22023', NULL, 'a key of another run');
SELECT is(pg_temp.steps_written(), :'before', 'refused completes wrote nothing');
SELECT is(pg_temp.begin(:'r2', :'tok2', :'ki', 'wipe', '{}', 'irreversible'), 'rejected', 'the call was rejected');
SELECT ok(runrow.complete_tool_call(:'r2', :'tok2', :'ki', '"rejected by dora: not today"') IS NOT NULL,
    'the rejection is reported to the model');
SELECT is((SELECT (state, is_error)::text FROM runrow.tool_effect WHERE idempotency_key = :'ki'), '(done,t)',
    'always as an error, even when is_error was not passed');

-- Fenced out.
SELECT pg_temp.tool_turn(:'r2', 'tu_f', 'f', '{}') AS sf \gset
SELECT pg_temp.key(:'r2', :sf, 'tu_f', 'f', '{}') AS kf \gset
SELECT pg_temp.begin(:'r2', :'tok2', :'kf', 'f', '{}', 'pure');
SELECT pg_temp.steps_written() AS before \gset
SELECT is(runrow.complete_tool_call(:'r2', gen_random_uuid(), :'kf', '"x"'), NULL, 'a wrong token: NULL');
SELECT runrow.finish_run(:'r2', :'tok2', 'completed');
SELECT pg_temp.steps_written() AS before2 \gset
SELECT is(runrow.complete_tool_call(:'r2', :'tok2', :'kf', '"x"'), NULL, 'a finished run: NULL');
SELECT is(pg_temp.steps_written(), :'before2', 'fenced-out completes wrote nothing');

-- Arrays: a tool's ordinary list is not a list of content blocks. Only a non-empty array of
-- objects whose type the API takes in a tool_result goes as content; any other reaches the model
-- as its JSON text (sent as is, the API refused the next request: 400 tool_result.content.0).
SELECT pg_temp.running() AS r3 \gset
SELECT pg_temp.token(:'r3') AS tok3 \gset
SELECT pg_temp.turn(:'r3', '[{"type":"tool_use","id":"tu_1","name":"a","input":{}},{"type":"tool_use","id":"tu_2","name":"b","input":{}},'
    '{"type":"tool_use","id":"tu_3","name":"c","input":{}},{"type":"tool_use","id":"tu_4","name":"d","input":{}},'
    '{"type":"tool_use","id":"tu_5","name":"f","input":{}},{"type":"tool_use","id":"tu_6","name":"t","input":{}},'
    '{"type":"tool_use","id":"tu_7","name":"look","input":{}},{"type":"tool_use","id":"tu_8","name":"lookup","input":{}}]');
CREATE TEMP TABLE list_calls (tu text, tool text, result jsonb, content text, what text);
INSERT INTO list_calls VALUES
    ('tu_1', 'a', '["a", "b"]', '"[\"a\", \"b\"]"', 'a list of plain values is sent as its JSON text'),
    ('tu_2', 'b', '[{"id": 1, "name": "alpha"}, {"id": 2, "name": "beta"}]',
     '"[{\"id\": 1, \"name\": \"alpha\"}, {\"id\": 2, \"name\": \"beta\"}]"', 'so is a list of rows (objects without a block type)'),
    ('tu_3', 'c', '[{"type": "text", "text": "x"}, 1]', '"[{\"text\": \"x\", \"type\": \"text\"}, 1]"',
     'so is a list mixing a content block with a plain value'),
    ('tu_4', 'd', '[{"type": "tool_use", "id": "x"}]', '"[{\"id\": \"x\", \"type\": \"tool_use\"}]"',
     'so is a list of objects whose type is no tool_result content block'),
    ('tu_5', 'f', '[]', '"[]"', 'so is an empty list'),
    ('tu_6', 't', '[{"type": "text", "text": "x"}, {"type": "image", "source": {"type": "url", "url": "https://example.test/a.png"}}]',
     '[{"text": "x", "type": "text"}, {"type": "image", "source": {"url": "https://example.test/a.png", "type": "url"}}]',
     'a list of text and image blocks is the content itself'),
    ('tu_7', 'look', '[{"type": "text", "name": "email"}, {"type": "image", "name": "avatar"}]',
     '"[{\"name\": \"email\", \"type\": \"text\"}, {\"name\": \"avatar\", \"type\": \"image\"}]"',
     'rows with a type column but no block''s fields (a form''s fields) are sent as their JSON text'),
    ('tu_8', 'lookup', '[{"type": "search_result", "source": "s", "title": "t", "content": []}, {"type": "tool_reference", "tool_name": "a"}]',
     '[{"type": "search_result", "title": "t", "source": "s", "content": []}, {"type": "tool_reference", "tool_name": "a"}]',
     'search_result and tool_reference blocks with their fields are the content itself');
SELECT pg_temp.begin(:'r3', :'tok3', pg_temp.key(:'r3', 1, tu, tool, '{}'), tool, '{}', 'pure') FROM list_calls ORDER BY tu;
SELECT runrow.complete_tool_call(:'r3', :'tok3', pg_temp.key(:'r3', 1, tu, tool, '{}'), result) FROM list_calls ORDER BY tu;
SELECT is((SELECT payload::text FROM runrow.agent_step WHERE run_id = :'r3' AND tool_use_id = c.tu),
    format('{"type":"tool_result","tool_use_id":"%s","content":%s,"is_error":false}', c.tu, c.content), c.what)
FROM list_calls AS c ORDER BY c.tu;
SELECT is(runrow.complete_tool_call(:'r3', :'tok3', pg_temp.key(:'r3', 1, 'tu_2', 'b', '{}'),
        '[{"id": 1, "name": "alpha"}, {"id": 2, "name": "beta"}]'),
    (SELECT seq FROM runrow.agent_step WHERE run_id = :'r3' AND tool_use_id = 'tu_2'),
    'the result recorded is the tool''s own list: repeating it returns the same seq');

-- Bad input.
SELECT pg_temp.steps_written() AS before \gset
SELECT throws_ok(format('SELECT runrow.complete_tool_call(NULL, %L, %L, ''1'')', :'tok', :'kx'), '22004', 'run_id must not be NULL', 'run_id NULL');
SELECT throws_ok(format('SELECT runrow.complete_tool_call(%L, NULL, %L, ''1'')', :'r', :'kx'), '22004', 'claim_token must not be NULL', 'claim_token NULL');
SELECT throws_ok(format('SELECT runrow.complete_tool_call(%L, %L, NULL, ''1'')', :'r', :'tok'), '22004', 'idempotency_key must not be NULL', 'idempotency_key NULL');
SELECT throws_ok(format('SELECT runrow.complete_tool_call(%L, %L, ''ABC'', ''1'')', :'r', :'tok'), '22023',
    'idempotency_key must be 64 lowercase hex characters, as runrow.tool_call_key returns', 'a malformed key');
SELECT throws_ok(format('SELECT runrow.complete_tool_call(%L, %L, %L, NULL)', :'r', :'tok', :'kx'), '22004', 'result must not be NULL', 'result NULL');
SELECT throws_ok(format('SELECT runrow.complete_tool_call(%L, %L, %L, ''1'', NULL)', :'r', :'tok', :'kx'), '22004', 'is_error must not be NULL', 'is_error NULL');
SELECT throws_ok(format('SELECT runrow.complete_tool_call(%L, %L, %L, to_jsonb(repeat(''x'', 8388608)))', :'r', :'tok', :'kx'), '22023',
    'result is too large: the limit is 8 MiB', 'a result over 8 MiB');
SELECT is(pg_temp.steps_written(), :'before', 'bad input wrote nothing');

SELECT * FROM finish();
ROLLBACK;
