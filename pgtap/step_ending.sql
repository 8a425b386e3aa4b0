-- A model turn's ending beyond its stop_reason on its step (migration 0108): append_step's
-- stop_sequence and stop_details, read back by get_step, copied by fork_run and by the retry of a
-- fork, kept once trim_journal has deleted the events; fenced out and bad input write nothing.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/row_versions.psql
\ir helpers/steps.psql
SELECT plan(31);
SELECT pg_temp.drain_queue();

SELECT is((SELECT count(*)::int FROM pg_proc WHERE pronamespace = 'runrow'::regnamespace AND proname = 'append_step'), 1,
    'append_step has one form (a call of the older one''s arguments is not ambiguous)');
SELECT is((SELECT count(*)::int FROM pg_proc WHERE pronamespace = 'runrow'::regnamespace AND proname = '_append_step'), 1,
    '_append_step has one form');

-- Happy path, as the worker role.
\set refusal '''{"type": "refusal", "category": "cyber", "explanation": null}'''
SELECT run_id AS src FROM runrow.enqueue_run(gen_random_uuid(), '"hi"', 'model-a',
    user_id => 'alice', metadata => '{"stop_sequences": ["\n\nEND"]}') \gset
SELECT pg_temp.claim(:'src') AS tok \gset
SET LOCAL ROLE runrow_worker;
SELECT is(runrow.append_step(:'src', :'tok', 'model_turn', '[{"type":"text","text":"one"}]', 'req_1',
    stop_reason => 'stop_sequence', stop_sequence => E'\n\nEND'), 1, 'a turn that met a stop sequence is stored');
SELECT is((SELECT (stop_reason, stop_sequence, stop_details)::text FROM runrow.get_step(:'src', 1)),
    (text 'stop_sequence', E'\n\nEND', NULL::jsonb)::text,
    'get_step reads its stop_sequence back, newlines and all (the run''s own request''s sequence)');
SELECT is(runrow.append_step(:'src', :'tok', 'model_turn', '[{"type":"text","text":"no"}]',
    stop_reason => 'refusal', stop_details => :refusal), 2, 'a refusal with its details is stored');
SELECT is((SELECT (stop_reason, stop_sequence, stop_details)::text FROM runrow.get_step(:'src', 2)),
    (text 'refusal', NULL::text, :refusal::jsonb)::text, 'get_step reads its stop_details back');
SELECT is(runrow.append_step(:'src', :'tok', 'model_turn', '[{"type":"text","text":"old"}]',
    usage => '{"input_tokens": 1}', stop_reason => 'end_turn'), 3, 'a caller that passes neither (an older worker) still appends');
SELECT is((SELECT (stop_sequence, stop_details)::text FROM runrow.get_step(:'src', 3)), '(,)',
    'and its step has neither');
RESET ROLE;

-- Fenced out: NULL and nothing written.
SELECT pg_temp.steps_written() AS before \gset
SELECT is(runrow.append_step(:'src', gen_random_uuid(), 'model_turn', '[{"type":"text","text":"zombie"}]',
    stop_reason => 'stop_sequence', stop_sequence => 'END', stop_details => '{}'), NULL,
    'a wrong token appends nothing and returns NULL');
SELECT is(pg_temp.steps_written(), :'before', 'a fenced-out append wrote nothing');
SELECT runrow.finish_run(:'src', :'tok', 'completed', '{"text": "old"}');
SELECT pg_temp.steps_written() AS before \gset
SELECT is(runrow.append_step(:'src', :'tok', 'model_turn', '[{"type":"text","text":"late"}]',
    stop_reason => 'stop_sequence', stop_sequence => 'END'), NULL, 'a finished run takes no step');
SELECT is(pg_temp.steps_written(), :'before', 'nor does it write anything');

-- Bad input: 22023 naming the argument, nothing written, even before the fence.
SELECT pg_temp.running() AS r \gset
SELECT pg_temp.token(:'r') AS rtok \gset
\set ok_turn '''[{"type":"text","text":"x"}]'''
SELECT pg_temp.steps_written() AS before \gset
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', %L, stop_sequence => '''')', :'r', :'rtok', :ok_turn),
    '22023', 'stop_sequence must be NULL or 1 to 4096 characters', 'an empty stop_sequence');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', %L, stop_sequence => %L)', :'r', :'rtok', :ok_turn,
    repeat('s', 4097)), '22023', 'stop_sequence must be NULL or 1 to 4096 characters', 'a stop_sequence over 4096 characters');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', %L, stop_details => ''["refusal"]'')', :'r', :'rtok', :ok_turn),
    '22023', 'stop_details must be NULL or a JSON object, got array', 'stop_details that is not an object');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''model_turn'', %L, stop_details => %L)', :'r', :'rtok', :ok_turn,
    jsonb_build_object('explanation', repeat('x', 65536))),
    '22023', 'stop_details is too large: 65555 bytes, the limit is 64 KiB', 'stop_details over 64 KiB');
SELECT pg_temp.tool_turn(:'r', 'tu_1', 'look', '{}') AS tseq \gset
SELECT pg_temp.steps_written() AS before \gset
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''tool_result'', ''{"type":"tool_result","tool_use_id":"tu_1"}'', '
    'stop_sequence => ''END'')', :'r', :'rtok'),
    '22023', 'usage, stop_reason, stop_sequence and stop_details belong to a model_turn, not a tool_result',
    'stop_sequence on a tool_result');
SELECT throws_ok(format('SELECT runrow.append_step(%L, %L, ''tool_result'', ''{"type":"tool_result","tool_use_id":"tu_1"}'', '
    'stop_details => ''{}'')', :'r', :'rtok'),
    '22023', 'usage, stop_reason, stop_sequence and stop_details belong to a model_turn, not a tool_result',
    'stop_details on a tool_result');
SELECT is(pg_temp.steps_written(), :'before', 'bad input wrote nothing');

-- The table's own rules (its CHECKs), for a writer that is not append_step; and it is
-- append-only, as agent_step is.
SELECT throws_ok(format('INSERT INTO runrow.agent_step_ending (run_id, seq) VALUES (%L, 1)', :'src'),
    '23514', NULL, 'an ending row with neither field is refused by the table');
SELECT throws_ok(format('INSERT INTO runrow.agent_step_ending (run_id, seq, stop_sequence) VALUES (%L, 3, '''')', :'src'),
    '23514', NULL, 'an empty stop_sequence is refused by the table');
SELECT throws_ok(format('INSERT INTO runrow.agent_step_ending (run_id, seq, stop_details) VALUES (%L, 3, ''"refusal"'')', :'src'),
    '23514', NULL, 'stop_details that is not an object is refused by the table');
SELECT throws_ok(format('INSERT INTO runrow.agent_step_ending (run_id, seq, stop_sequence) VALUES (%L, 99, ''END'')', :'src'),
    '23503', NULL, 'an ending of a step that does not exist is refused (its foreign key)');
SELECT throws_ok(format('DELETE FROM runrow.agent_step_ending WHERE run_id = %L', :'src'),
    '23000', 'agent_step_ending is append-only: rows cannot be deleted', 'an ending is never deleted');
SELECT throws_ok(format('UPDATE runrow.agent_step_ending SET stop_sequence = ''X'' WHERE run_id = %L', :'src'),
    '23000', 'agent_step_ending is append-only: rows cannot be updated', 'nor changed');
SELECT is((SELECT array_agg(seq ORDER BY seq) FROM runrow.agent_step_ending WHERE run_id = :'src'), ARRAY[1, 2],
    'only the two turns with an ending have a row (an append without one writes none)');

-- A fork copies them, and they outlive the source's journal: trim_journal deletes a finished
-- run's events, not its steps.
SELECT pg_temp.age_finished(:'src', '2 days');
SELECT runrow.trim_journal('1 day');
SELECT is((SELECT count(*)::int FROM runrow.run_event WHERE run_id = :'src'), 0, 'the source''s journal is trimmed');
SELECT new_run_id AS fork FROM runrow.fork_run(:'src', 2) \gset
SELECT is((SELECT (stop_reason, stop_sequence)::text FROM runrow.get_step(:'fork', 1)),
    (text 'stop_sequence', E'\n\nEND')::text, 'the fork''s copy of step 1 keeps its stop_sequence');
SELECT is((SELECT stop_details FROM runrow.get_step(:'fork', 2)), :refusal::jsonb,
    'the fork''s copy of step 2 keeps its stop_details');

-- The retry of a fork is given the fork's copied steps as they are.
SELECT pg_temp.claim(:'fork') AS ftok \gset
SELECT runrow.finish_run(:'fork', :'ftok', 'failed', NULL, 'boom');
SELECT runrow.retry_run(:'fork') AS again \gset
SELECT is(
    (SELECT array_agg((s.stop_reason, e.stop_sequence, e.stop_details)::text ORDER BY s.seq)
     FROM runrow.agent_step AS s LEFT JOIN runrow.agent_step_ending AS e USING (run_id, seq)
     WHERE s.run_id = :'again'),
    (SELECT array_agg((s.stop_reason, e.stop_sequence, e.stop_details)::text ORDER BY s.seq)
     FROM runrow.agent_step AS s LEFT JOIN runrow.agent_step_ending AS e USING (run_id, seq)
     WHERE s.run_id = :'src' AND s.seq <= 2),
    'the retry of the fork keeps both');
SELECT is((SELECT count(*)::int FROM runrow.agent_step WHERE run_id = :'again'), 2, 'steps 1..2, no more');

SELECT * FROM finish();
ROLLBACK;
