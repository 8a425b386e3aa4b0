-- runrow.get_step: a step's kind, stop_reason, usage, request_id and attempt.
BEGIN;
\ir helpers/setup.psql
SELECT plan(9);
SELECT pg_temp.drain_queue();

SELECT pg_temp.new_run() AS run \gset
SELECT pg_temp.claim(:'run') AS tok \gset
SELECT runrow.append_step(:'run', :'tok', 'model_turn',
    '[{"type": "tool_use", "id": "tu_1", "name": "t", "input": {}}]', 'req_1',
    usage => '{"input_tokens": 3, "output_tokens": 5}', stop_reason => 'tool_use');
SELECT runrow.append_step(:'run', :'tok', 'tool_result', '{"type": "tool_result", "tool_use_id": "tu_1", "content": "ok"}');

SET LOCAL ROLE runrow_worker;
SELECT is((SELECT (kind, stop_reason, request_id, attempt)::text FROM runrow.get_step(:'run', 1)),
    '(model_turn,tool_use,req_1,1)', 'a model turn: kind, stop_reason, request_id, attempt');
SELECT is((SELECT usage ->> 'output_tokens' FROM runrow.get_step(:'run', 1)), '5', 'its usage');
SELECT is((SELECT (kind, stop_reason, usage, request_id)::text FROM runrow.get_step(:'run', 2)),
    '(tool_result,,,)', 'a tool result has no stop_reason, usage or request_id');
RESET ROLE;

-- Reading needs no claim: after the run ended (or was reaped) the log is still readable.
SELECT runrow.finish_run(:'run', :'tok', 'completed');
SELECT is((SELECT stop_reason FROM runrow.get_step(:'run', 1)), 'tool_use', 'readable after the run ended');

SELECT throws_ok(format('SELECT * FROM runrow.get_step(%L, 3)', :'run'), 'P0002',
    format('run_id %s has no step 3', :'run'), 'a step that does not exist');
SELECT throws_ok('SELECT * FROM runrow.get_step(NULL, 1)', '22004', 'run_id must not be NULL', 'NULL run_id');
SELECT throws_ok(format('SELECT * FROM runrow.get_step(%L, 0)', :'run'), '22023',
    'seq must be between 1 and 2147483647, got 0', 'seq 0');
SELECT throws_ok(format('SELECT * FROM runrow.get_step(%L, NULL)', :'run'), '22004', 'seq must not be NULL', 'NULL seq');
SELECT ok(NOT has_function_privilege('public', 'runrow.get_step(uuid, integer)', 'EXECUTE'), 'PUBLIC cannot execute it');

SELECT * FROM finish();
ROLLBACK;
