-- agent_step's row rules (migration 0048): one CHECK constraint, agent_step_rules, whose
-- expression calls runrow._agent_step_rules_valid; and its seq, given by the guard trigger to a
-- row that leaves it NULL (0051). Each rule refuses its row with the error and
-- constraint name the eight CHECKs it replaced gave, in their (name) order; a NULL passes, as in
-- a CHECK. Rows are written directly, as the tests' role (the owner's rights): the rules bind
-- everyone, not only append_step.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(21);
SELECT pg_temp.drain_queue();

SELECT results_eq(
    $$SELECT conname::text COLLATE "default", convalidated FROM pg_constraint
      WHERE conrelid = 'runrow.agent_step'::regclass AND contype = 'c'$$,
    $$VALUES ('agent_step_rules', true)$$,
    'agent_step has one CHECK constraint, validated');
SELECT ok(pg_get_constraintdef((SELECT oid FROM pg_constraint WHERE conname = 'agent_step_rules'))
    ~ '^CHECK \(runrow\._agent_step_rules_valid\(', 'its expression is one call of _agent_step_rules_valid');
SELECT ok(NOT has_function_privilege('runrow_worker', 'runrow._agent_step_rules_valid(text, integer, text, integer, text, jsonb, text)',
    'EXECUTE'), 'no runrow role may call the function itself');

-- Each rule through the function, by the name of the constraint it replaced (seq_check cannot
-- be reached by an INSERT: the guard trigger refuses a seq out of order first).
CREATE FUNCTION pg_temp.rule(kind text, seq int, request_id text, attempt int, tool_use_id text, usage jsonb,
    stop_reason text) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    name text;
BEGIN
    PERFORM runrow._agent_step_rules_valid(kind, seq, request_id, attempt, tool_use_id, usage, stop_reason);
    RETURN 'valid';
EXCEPTION WHEN check_violation THEN
    GET STACKED DIAGNOSTICS name = CONSTRAINT_NAME;
    RETURN name;
END
$fn$;
SELECT is(pg_temp.rule('model_turn', 1, 'req', 1, NULL, '{}', 'end_turn'), 'valid', 'a model turn with usage is valid');
SELECT is(pg_temp.rule('tool_result', 2, NULL, 1, 'tu_1', NULL, NULL), 'valid', 'a tool result naming its tool_use is valid');
SELECT is(pg_temp.rule(NULL, NULL, NULL, NULL, NULL, NULL, NULL), 'valid', 'NULLs pass, as in a CHECK');
SELECT is(pg_temp.rule('model_turn', 1, NULL, 0, NULL, NULL, NULL), 'agent_step_attempt_check', 'attempt 0');
SELECT is(pg_temp.rule('summary', 1, NULL, 1, NULL, NULL, NULL), 'agent_step_kind_check', 'an unknown kind');
SELECT is(pg_temp.rule('model_turn', 1, repeat('r', 256), 1, NULL, NULL, NULL), 'agent_step_request_id_check',
    'a request_id of 256 characters');
SELECT is(pg_temp.rule('model_turn', 0, NULL, 1, NULL, NULL, NULL), 'agent_step_seq_check', 'seq 0');
SELECT is(pg_temp.rule('model_turn', 1, NULL, 1, NULL, NULL, ''), 'agent_step_stop_reason_check', 'an empty stop_reason');
SELECT is(pg_temp.rule('tool_result', 1, NULL, 1, '', NULL, NULL), 'agent_step_tool_result_names_its_tool_use',
    'a tool result without its tool_use');
SELECT is(pg_temp.rule('model_turn', 1, NULL, 1, NULL, '[]', NULL), 'agent_step_usage_check', 'usage that is not an object');
SELECT is(pg_temp.rule('tool_result', 1, NULL, 1, 'tu_1', NULL, 'end_turn'), 'agent_step_usage_only_on_model_turns',
    'a stop_reason on a tool result');
SELECT is(pg_temp.rule('summary', 1, '', 0, NULL, NULL, NULL), 'agent_step_attempt_check',
    'of three broken rules the first by name is reported, as PostgreSQL orders CHECKs');

-- The constraint binds a direct write, with the message a failed CHECK gives.
SELECT pg_temp.running() AS r \gset
SELECT throws_ok(format($$INSERT INTO runrow.agent_step (run_id, seq, kind, payload, request_id, attempt)
        VALUES (%L, 1, 'model_turn', '[{"type": "text", "text": "x"}]', '', 1)$$, :'r'),
    '23514', 'new row for relation "agent_step" violates check constraint "agent_step_request_id_check"',
    'a direct INSERT with an empty request_id is refused');
SELECT throws_ok(format($$INSERT INTO runrow.agent_step (run_id, seq, kind, payload, attempt, usage)
        VALUES (%L, 1, 'model_turn', '[{"type": "text", "text": "x"}]', 1, '"lots"')$$, :'r'),
    '23514', 'new row for relation "agent_step" violates check constraint "agent_step_usage_check"',
    'a direct INSERT with usage that is not an object is refused');
SELECT lives_ok(format($$INSERT INTO runrow.agent_step (run_id, seq, kind, payload, attempt, usage, stop_reason)
        VALUES (%L, 1, 'model_turn', '[{"type": "text", "text": "x"}]', 1, '{}', 'end_turn')$$, :'r'),
    'a valid direct INSERT is accepted');

-- Its seq: the guard's (0051). A NULL seq is given the run's next one, for every role, and read
-- back; an explicit one must be that one.
WITH i AS (
    INSERT INTO runrow.agent_step (run_id, seq, kind, payload, attempt)
    VALUES (:'r', NULL, 'model_turn', '[{"type": "text", "text": "y"}]', 1) RETURNING seq
)
SELECT is((SELECT seq FROM i), 2, 'a NULL seq is given the next one');
SELECT throws_ok(format($$INSERT INTO runrow.agent_step (run_id, seq, kind, payload, attempt)
        VALUES (%L, 5, 'model_turn', '[{"type": "text", "text": "z"}]', 1)$$, :'r'),
    '23000', format('agent_step seq 5 for run %s is out of order: expected 3', :'r'),
    'an explicit seq that is not the next one is refused');
SELECT is((SELECT array_agg(seq ORDER BY seq) FROM runrow.agent_step WHERE run_id = :'r'), ARRAY[1, 2],
    'the step log is gap-free from 1');

SELECT * FROM finish();
ROLLBACK;
