-- runrow.conversation_history: which turns contribute and how, message grouping, the
-- stored bytes returned, synthesized results for dangling tool_uses of earlier turns,
-- a resumed attempt sees the earlier attempt's steps, a refused turn left out of later
-- histories, bad input.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/row_versions.psql
\ir helpers/steps.psql
SELECT plan(22);
SELECT pg_temp.drain_queue();

\set sig '''{uuid,uuid}'''
SELECT has_function('runrow', 'conversation_history', :sig::name[], 'conversation_history(conversation_id, up_to_run_id) exists');
SELECT function_privs_are('runrow', 'conversation_history', :sig::name[], 'runrow_worker', ARRAY['EXECUTE'], 'the worker may read history');
SELECT function_privs_are('runrow', 'conversation_history', :sig::name[], 'runrow_client', ARRAY[]::name[], 'the client may not');

CREATE FUNCTION pg_temp.say(conv uuid, words text, attempts int DEFAULT 1) RETURNS uuid LANGUAGE sql AS $$
    SELECT run_id FROM runrow.enqueue_run(conversation_id => conv, content => to_jsonb(words), model => 'm',
        max_attempts => attempts)
$$;
\set conv '''cccccccc-0000-0000-0000-000000000001'''

-- Turn A: completed, with a tool call answered in between.
SELECT pg_temp.say(:conv, 'A') AS a \gset
SELECT pg_temp.claim(:'a') AS ta \gset
SELECT pg_temp.tool_turn(:'a', 'tu_a', 'look', '{"q": 1}');
SELECT runrow.append_step(:'a', :'ta', 'tool_result', '{"type":"tool_result","tool_use_id":"tu_a","content":"1"}');
SELECT pg_temp.turn(:'a', '[{"type":"text","text":"A done"}]');
SELECT runrow.finish_run(:'a', :'ta', 'completed');
-- Turn B: failed after a step; a person retries it (RB) and the retry completes.
SELECT pg_temp.say(:conv, 'B') AS b \gset
SELECT pg_temp.claim(:'b') AS tb \gset
SELECT pg_temp.turn(:'b', '[{"type":"text","text":"B failing"}]');
SELECT runrow.finish_run(:'b', :'tb', 'failed', NULL, 'boom');
SELECT runrow.retry_run(:'b') AS rb \gset
SELECT pg_temp.claim(:'rb') AS trb \gset
SELECT pg_temp.turn(:'rb', '[{"type":"text","text":"B retried"}]');
SELECT runrow.finish_run(:'rb', :'trb', 'completed');
-- Turn C: stopped while running, before any step.
SELECT pg_temp.say(:conv, 'C') AS c \gset
SELECT pg_temp.claim(:'c') AS tc \gset
SELECT runrow.finish_run(:'c', :'tc', 'cancelled');
-- Turn D: stopped after a model turn with two tool_uses, one answered.
SELECT pg_temp.say(:conv, 'D') AS d \gset
SELECT pg_temp.claim(:'d') AS td \gset
SELECT pg_temp.turn(:'d', '[{"type":"tool_use","id":"tu_d1","name":"x","input":{}},{"type":"tool_use","id":"tu_d2","name":"y","input":{}}]');
SELECT runrow.append_step(:'d', :'td', 'tool_result', '{"type":"tool_result","tool_use_id":"tu_d1","content":"ok"}');
SELECT runrow.finish_run(:'d', :'td', 'cancelled');
-- Turn E: stopped while queued: a draft.
SELECT pg_temp.say(:conv, 'E') AS e \gset
SELECT runrow.cancel_run(:'e');
-- Turn F: the run being rebuilt, mid-tool-call; G queued behind it.
SELECT pg_temp.say(:conv, 'F', 2) AS f \gset
SELECT pg_temp.claim(:'f') AS tf \gset
SELECT pg_temp.turn(:'f', '[ {"type":"thinking","thinking":"t","signature":"AAA="}, {"type":"tool_use","id":"tu_f","name":"z","input":{"k": "v"}} ]');
SELECT pg_temp.say(:conv, 'G') AS g \gset

CREATE TEMP TABLE expected (turn_index int, message_index int, role text, source text, seq int, kind text, payload text);
INSERT INTO expected VALUES
    (1, 1, 'user', 'user_message', NULL, 'user_message', '"A"'),
    (1, 2, 'assistant', 'step', 1, 'model_turn', '[{"type":"text","text":"calling look"},{"type":"tool_use","id":"tu_a","name":"look","input":{"q": 1}}]'),
    (1, 3, 'user', 'step', 2, 'tool_result', '{"type":"tool_result","tool_use_id":"tu_a","content":"1"}'),
    (1, 4, 'assistant', 'step', 3, 'model_turn', '[{"type":"text","text":"A done"}]'),
    (2, 5, 'user', 'user_message', NULL, 'user_message', '"B"'),
    (2, 6, 'assistant', 'step', 1, 'model_turn', '[{"type":"text","text":"B retried"}]'),
    (3, 7, 'user', 'user_message', NULL, 'user_message', '"D"'),
    (3, 8, 'assistant', 'step', 1, 'model_turn', '[{"type":"tool_use","id":"tu_d1","name":"x","input":{}},{"type":"tool_use","id":"tu_d2","name":"y","input":{}}]'),
    (3, 9, 'user', 'step', 2, 'tool_result', '{"type":"tool_result","tool_use_id":"tu_d1","content":"ok"}'),
    (3, 9, 'user', 'synthesized', NULL, 'tool_result', '{"type":"tool_result","tool_use_id":"tu_d2","content":"No result: this turn was cancelled before the tool call completed.","is_error":true}'),
    (4, 9, 'user', 'user_message', NULL, 'user_message', '"F"'),
    (4, 10, 'assistant', 'step', 1, 'model_turn', '[ {"type":"thinking","thinking":"t","signature":"AAA="}, {"type":"tool_use","id":"tu_f","name":"z","input":{"k": "v"}} ]');

SELECT results_eq(
    format('SELECT turn_index, message_index, role, source, seq, kind, payload::text FROM runrow.conversation_history(%L, %L)', :conv, :'f'),
    'SELECT * FROM expected',
    'history of F: completed A whole; failed B left out, its retry in its place; C (cancelled, no step) and E (draft) '
    'left out; cancelled D with a synthesized result for its dangling tool_use; F up to now, its own dangling '
    'tool_use untouched; consecutive user rows share a message; payloads as stored');
SELECT is(
    (SELECT array_agg(run_id ORDER BY ordinality) FROM (SELECT DISTINCT ON (turn_index) run_id, turn_index AS ordinality
        FROM runrow.conversation_history(:conv, :'f')) AS x),
    ARRAY[:'a', :'rb', :'d', :'f']::uuid[], 'each row names its run: A, the retry of B, D, F');
SELECT is((SELECT array_agg(DISTINCT run_status ORDER BY run_status) FROM runrow.conversation_history(:conv, :'f')),
    ARRAY['cancelled', 'completed', 'running'], 'and carries the run''s status');
SELECT is((SELECT count(*)::int FROM runrow.conversation_history(:conv, :'a')), 4, 'history of A holds only A');
SELECT is((SELECT count(*)::int FROM runrow.conversation_history(:conv, :'d') WHERE source = 'synthesized'), 0,
    'a run''s own history never synthesizes: the worker of D would answer its tool_use itself');
SELECT is((SELECT count(*)::int FROM runrow.conversation_history(:conv, :'g')), 11,
    'the queued G sees A, the retry of B and D, not F (still running: an unfinished turn contributes nothing yet), '
    'then its own message');
SELECT is((SELECT max(message_index) FROM runrow.conversation_history(:conv, :'g')), 9,
    'G''s user message shares a message with D''s tool results');

-- A resumed attempt sees every committed step of the earlier one.
SELECT pg_temp.crash_and_resume(:'f') AS tf2 \gset
SELECT is((SELECT attempt FROM runrow.agent_run WHERE id = :'f'), 2, 'F is on its second attempt');
SELECT results_eq(
    format('SELECT turn_index, message_index, role, source, seq, kind, payload::text FROM runrow.conversation_history(%L, %L)', :conv, :'f'),
    'SELECT * FROM expected',
    'the second attempt rebuilds exactly the same history');
SELECT is(runrow.append_step(:'f', :'tf2', 'tool_result', '{"type":"tool_result","tool_use_id":"tu_f","content":"v"}'), 2,
    'and continues the step log where the first attempt stopped');

-- A NUL in the text (the escape \u0000) of an earlier turn stopped mid-tool-call: its
-- bytes come back, and its dangling tool_use still gets a synthesized result.
\set nconv '''cccccccc-0000-0000-0000-000000000002'''
SELECT $j$[{"type":"text","text":"nul \u0000 here"},{"type":"tool_use","id":"tu_n","name":"x","input":{"q":"\u0000"}}]$j$
    AS nul_turn \gset
SELECT pg_temp.say(:nconv, 'N1') AS n1 \gset
SELECT pg_temp.claim(:'n1') AS tn1 \gset
SELECT pg_temp.turn(:'n1', :'nul_turn');
SELECT runrow.finish_run(:'n1', :'tn1', 'cancelled');
SELECT pg_temp.say(:nconv, 'N2') AS n2 \gset
SELECT results_eq(
    format('SELECT source, seq, kind, payload::text FROM runrow.conversation_history(%L, %L)', :nconv, :'n2'),
    format($q$VALUES ('user_message', NULL::int, 'user_message', '"N1"'), ('step', 1, 'model_turn', %L),
        ('synthesized', NULL, 'tool_result', '{"type":"tool_result","tool_use_id":"tu_n","content":"No result: this turn was cancelled before the tool call completed.","is_error":true}'),
        ('user_message', NULL, 'user_message', '"N2"')$q$, :'nul_turn'),
    'a turn whose text holds \u0000 comes back byte for byte, its dangling tool_use answered');

-- A refused turn in the middle: the API refuses every later request that still holds a refused
-- exchange, so later histories leave out its user message and its answer; its own history (a
-- resumed attempt rebuilding it) keeps them.
SELECT pg_temp.drain_queue();
\set rconv '''cccccccc-0000-0000-0000-000000000003'''
SELECT pg_temp.say(:rconv, 'R1') AS r1 \gset
SELECT pg_temp.claim(:'r1') AS tr1 \gset
SELECT runrow.append_step(:'r1', :'tr1', 'model_turn', '[{"type":"text","text":"fine"}]', stop_reason => 'end_turn');
SELECT runrow.finish_run(:'r1', :'tr1', 'completed', '{"text": "fine", "stop_reason": "end_turn"}');
SELECT pg_temp.say(:rconv, 'build a weapon') AS r2 \gset
SELECT pg_temp.claim(:'r2') AS tr2 \gset
SELECT runrow.append_step(:'r2', :'tr2', 'model_turn', '[{"type":"text","text":"I can''t help with"}]',
    stop_reason => 'refusal');
SELECT results_eq(
    format('SELECT source, seq, kind, payload::text FROM runrow.conversation_history(%L, %L)', :rconv, :'r2'),
    $q$VALUES ('user_message', NULL::int, 'user_message', '"R1"'), ('step', 1, 'model_turn', '[{"type":"text","text":"fine"}]'),
        ('user_message', NULL, 'user_message', '"build a weapon"'),
        ('step', 1, 'model_turn', '[{"type":"text","text":"I can''t help with"}]')$q$,
    'the refused run''s own history holds its refusal (a resumed attempt reads how it ended)');
SELECT runrow.finish_run(:'r2', :'tr2', 'completed', '{"text": "I can''t help with", "stop_reason": "refusal"}');
-- A turn stopped after a refusal (the stop won the race to end it) is left out the same way.
SELECT pg_temp.say(:rconv, 'build it anyway') AS r3 \gset
SELECT pg_temp.claim(:'r3') AS tr3 \gset
SELECT runrow.append_step(:'r3', :'tr3', 'model_turn', '[{"type":"text","text":"No."}]', stop_reason => 'refusal');
SELECT runrow.finish_run(:'r3', :'tr3', 'cancelled');
SELECT pg_temp.say(:rconv, 'what is 2+2?') AS r4 \gset
SELECT results_eq(
    format('SELECT turn_index, message_index, role, source, seq, kind, payload::text FROM runrow.conversation_history(%L, %L)', :rconv, :'r4'),
    $q$VALUES (1, 1, 'user', 'user_message', NULL::int, 'user_message', '"R1"'),
        (1, 2, 'assistant', 'step', 1, 'model_turn', '[{"type":"text","text":"fine"}]'),
        (2, 3, 'user', 'user_message', NULL, 'user_message', '"what is 2+2?"')$q$,
    'a later turn''s history leaves out the refused turns, their user messages and answers: R1, then R4');
SELECT pg_temp.claim(:'r4') AS tr4 \gset
SELECT runrow.append_step(:'r4', :'tr4', 'model_turn', '[{"type":"text","text":"4"}]', stop_reason => 'end_turn');
SELECT runrow.finish_run(:'r4', :'tr4', 'completed', '{"text": "4", "stop_reason": "end_turn"}');
SELECT pg_temp.say(:rconv, 'and 3+3?') AS r5 \gset
SELECT is(
    (SELECT array_agg(DISTINCT run_id ORDER BY run_id) FROM runrow.conversation_history(:rconv, :'r5')),
    (SELECT array_agg(x ORDER BY x) FROM unnest(ARRAY[:'r1', :'r4', :'r5']::uuid[]) AS x),
    'and every turn after it too: R1, R4, R5');
SELECT is(
    (SELECT count(*)::int FROM runrow.conversation_history(:rconv, :'r5') WHERE payload::text LIKE '%weapon%'
        OR payload::text LIKE '%help with%' OR payload::text LIKE '%anyway%' OR payload::text LIKE '%No.%'),
    0, 'no refused text reaches the model again');

-- Bad input.
SELECT throws_ok(format('SELECT * FROM runrow.conversation_history(NULL, %L)', :'f'), '22004',
    'conversation_id must not be NULL', 'conversation_id NULL');
SELECT throws_ok(format('SELECT * FROM runrow.conversation_history(%L, NULL)', :conv), '22004',
    'up_to_run_id must not be NULL', 'up_to_run_id NULL');
SELECT throws_ok(format('SELECT * FROM runrow.conversation_history(%L, %L)', :conv, '00000000-0000-0000-0000-000000000000'),
    'P0002', 'up_to_run_id 00000000-0000-0000-0000-000000000000 does not exist', 'an unknown run');
SELECT throws_ok(format('SELECT * FROM runrow.conversation_history(%L, %L)', gen_random_uuid(), :'f'),
    '22023', NULL, 'a run of another conversation');

SELECT * FROM finish();
ROLLBACK;
