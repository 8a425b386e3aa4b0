-- runrow.run_usage: per-run token totals of the model turns in the step log (runrow status RUN).
BEGIN;
\ir helpers/setup.psql
SELECT plan(11);
SELECT pg_temp.drain_queue();

SELECT pg_temp.new_run(attempts => 2) AS run \gset
SELECT is((SELECT (model_turns, input_tokens, output_tokens, cache_read_input_tokens,
                   cache_creation_input_tokens)::text FROM runrow.run_usage(:'run')),
    '(0,0,0,0,0)', 'a run without model turns: zeros');

SELECT pg_temp.claim(:'run') AS tok \gset
SELECT runrow.append_step(:'run', :'tok', 'model_turn',
    '[{"type": "tool_use", "id": "tu_1", "name": "t", "input": {}}]', 'req_1',
    usage => '{"input_tokens": 3, "output_tokens": 5, "cache_read_input_tokens": 0,
               "cache_creation_input_tokens": 3000, "cache_creation": {"ephemeral_5m_input_tokens": 3000}}',
    stop_reason => 'tool_use');
SELECT runrow.append_step(:'run', :'tok', 'tool_result', '{"type": "tool_result", "tool_use_id": "tu_1", "content": "ok"}');
-- Fenced out: the attempt is reaped and taken over; its late append stores nothing, so counts nothing.
SELECT pg_temp.expire(:'run');
SELECT count(*) FROM runrow.reap_expired_runs(grace_seconds => 0);
SELECT pg_temp.claim(:'run') AS tok2 \gset
SELECT is(runrow.append_step(:'run', :'tok', 'model_turn', '[{"type": "text", "text": "zombie"}]', 'req_z',
    usage => '{"input_tokens": 1000000, "output_tokens": 1000000}', stop_reason => 'end_turn'), NULL,
    'the fenced-out append stored nothing');
-- The second attempt's turn counts: what was paid for, over every attempt. A field that is not a
-- number (another provider, an older SDK) counts 0.
SELECT runrow.append_step(:'run', :'tok2', 'model_turn', '[{"type": "text", "text": "done"}]', 'req_2',
    usage => '{"input_tokens": 2, "output_tokens": 7, "cache_read_input_tokens": 3000,
               "cache_creation_input_tokens": "lots"}',
    stop_reason => 'end_turn');

SET LOCAL ROLE runrow_client;
SELECT is((SELECT (model_turns, input_tokens, output_tokens, cache_read_input_tokens,
                   cache_creation_input_tokens)::text FROM runrow.run_usage(:'run')),
    '(2,5,12,3000,3000)', 'sums over both attempts'' turns; the fenced-out one and a non-number count nothing');
RESET ROLE;
SET LOCAL ROLE runrow_auditor;
SELECT is((SELECT model_turns FROM runrow.run_usage(:'run')), 2::bigint, 'the auditor reads it too');
RESET ROLE;

SELECT runrow.finish_run(:'run', :'tok2', 'completed');
SELECT is((SELECT output_tokens FROM runrow.run_usage(:'run')), 12::bigint, 'readable after the run ended');

-- A fork is given its source's steps, which the source paid for: a fork that never ran reported
-- the source's tokens (the history audit). Its own turns count.
SELECT new_run_id AS fork FROM runrow.fork_run(:'run', 3) \gset
SELECT is((SELECT (model_turns, input_tokens, output_tokens)::text FROM runrow.run_usage(:'fork')), '(0,0,0)',
    'a fork that has not run: zeros, not its source''s turns');
SELECT pg_temp.claim(:'fork') AS ftok \gset
SELECT runrow.append_step(:'fork', :'ftok', 'model_turn', '[{"type": "text", "text": "again"}]', 'req_f',
    usage => '{"input_tokens": 4, "output_tokens": 6}', stop_reason => 'end_turn');
SELECT is((SELECT (model_turns, input_tokens, output_tokens)::text FROM runrow.run_usage(:'fork')), '(1,4,6)',
    'its own turn counts');

SELECT throws_ok('SELECT * FROM runrow.run_usage(NULL)', '22004', 'run_id must not be NULL', 'NULL run_id');
SELECT throws_ok('SELECT * FROM runrow.run_usage(''00000000-0000-0000-0000-000000000000'')', 'P0002',
    'run_id 00000000-0000-0000-0000-000000000000 does not exist', 'an unknown run');
SELECT ok(NOT has_function_privilege('public', 'runrow.run_usage(uuid)', 'EXECUTE'), 'PUBLIC cannot execute it');
SELECT isnt((SELECT obj_description('runrow.run_usage(uuid)'::regprocedure)), NULL, 'it states its contract');

SELECT * FROM finish();
ROLLBACK;
