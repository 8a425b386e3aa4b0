-- tool_effect's row rules (migration 0053): one CHECK constraint, tool_effect_rules, whose
-- expression calls runrow._tool_effect_rules_valid. Each rule refuses its row with the error
-- and constraint name the fourteen CHECKs it replaced gave, in their (name) order; a NULL
-- passes, as in a CHECK. The key's rule is ^[0-9a-f]{64}$ tested without the regex engine:
-- the edge cases here are the strings where the two could differ. Rows are written directly,
-- as the tests' role (the owner's rights): the rules bind everyone, not only the tool-call
-- functions.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(31);
SELECT pg_temp.drain_queue();

SELECT results_eq(
    $$SELECT conname::text COLLATE "default", convalidated FROM pg_constraint
      WHERE conrelid = 'runrow.tool_effect'::regclass AND contype = 'c'$$,
    $$VALUES ('tool_effect_rules', true)$$,
    'tool_effect has one CHECK constraint, validated');
SELECT ok(pg_get_constraintdef((SELECT oid FROM pg_constraint WHERE conname = 'tool_effect_rules'))
    ~ '^CHECK \(runrow\._tool_effect_rules_valid\(', 'its expression is one call of _tool_effect_rules_valid');
SELECT ok(NOT has_function_privilege('runrow_worker', 'runrow._tool_effect_rules_valid(text, text, text, jsonb, '
    'text, text, jsonb, boolean, integer, boolean, text, text, timestamptz, integer, integer, timestamptz, timestamptz)',
    'EXECUTE'), 'no runrow role may call the function itself');

-- A valid executing call; each case below changes what its name says.
CREATE FUNCTION pg_temp.rule(
    idempotency_key text DEFAULT repeat('ab', 32), tool_use_id text DEFAULT 'toolu_1', tool text DEFAULT 'echo',
    args jsonb DEFAULT '{}', effect text DEFAULT 'idempotent', state text DEFAULT 'executing',
    result jsonb DEFAULT NULL, is_error boolean DEFAULT NULL, result_step_seq int DEFAULT NULL,
    approved boolean DEFAULT NULL, decided_by text DEFAULT NULL, decision_note text DEFAULT NULL,
    decided_at timestamptz DEFAULT NULL, attempt int DEFAULT 1, started_attempt int DEFAULT 1,
    started_at timestamptz DEFAULT now(), completed_at timestamptz DEFAULT NULL
) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    name text;
BEGIN
    PERFORM runrow._tool_effect_rules_valid(idempotency_key, tool_use_id, tool, args, effect, state, result,
        is_error, result_step_seq, approved, decided_by, decision_note, decided_at, attempt, started_attempt,
        started_at, completed_at);
    RETURN 'valid';
EXCEPTION WHEN check_violation THEN
    GET STACKED DIAGNOSTICS name = CONSTRAINT_NAME;
    RETURN name;
END
$fn$;
SELECT is(pg_temp.rule(), 'valid', 'an executing call is valid');
SELECT is(pg_temp.rule(state => 'done', result => '"ok"', is_error => false, result_step_seq => 2,
    completed_at => now()), 'valid', 'a done call with its result is valid');
SELECT is(pg_temp.rule(effect => 'irreversible', state => 'approved', approved => true, decided_by => 'ann',
    decided_at => now()), 'valid', 'an approved irreversible call is valid');
SELECT is(pg_temp.rule(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL), 'valid', 'NULLs pass, as in a CHECK');
SELECT is(pg_temp.rule(args => '[]'), 'tool_effect_args_check', 'args that are not an object');
SELECT is(pg_temp.rule(attempt => 0), 'tool_effect_attempt_check', 'attempt 0');
SELECT is(pg_temp.rule(decided_by => ''), 'tool_effect_decided_by_check', 'an empty decided_by');
SELECT is(pg_temp.rule(approved => true), 'tool_effect_decision_complete', 'a decision without who and when');
SELECT is(pg_temp.rule(decision_note => repeat('n', 10001)), 'tool_effect_decision_note_check',
    'a note of 10,001 characters');
SELECT is(pg_temp.rule(state => 'done'), 'tool_effect_done_iff_result', 'done without a result');
SELECT is(pg_temp.rule(effect => 'risky'), 'tool_effect_effect_check', 'an unknown effect');
SELECT is(pg_temp.rule(idempotency_key => 'k-1'), 'tool_effect_idempotency_key_check', 'a short key');
SELECT is(pg_temp.rule(effect => 'irreversible'), 'tool_effect_irreversible_needs_yes',
    'an irreversible call executing without a yes');
SELECT is(pg_temp.rule(started_attempt => 0), 'tool_effect_started_attempt_check', 'started_attempt 0');
SELECT is(pg_temp.rule(started_at => NULL), 'tool_effect_started_together', 'a start without its time');
SELECT is(pg_temp.rule(state => 'paused'), 'tool_effect_state_check', 'an unknown state');
SELECT is(pg_temp.rule(tool => ''), 'tool_effect_tool_check', 'an empty tool');
SELECT is(pg_temp.rule(tool_use_id => ''), 'tool_effect_tool_use_id_check', 'an empty tool_use_id');
SELECT is(pg_temp.rule(tool => '', attempt => 0, args => '1'), 'tool_effect_args_check',
    'of three broken rules the first by name is reported, as PostgreSQL orders CHECKs');

-- The key: exactly 64 characters, each one of 0-9a-f, as the regular expression it replaces.
SELECT is(pg_temp.rule(idempotency_key => repeat('0123456789abcdef', 4)), 'valid', 'every hex digit');
SELECT is(pg_temp.rule(idempotency_key => repeat('ab', 31) || 'aB'), 'tool_effect_idempotency_key_check',
    'one uppercase digit');
SELECT is(pg_temp.rule(idempotency_key => repeat('ab', 31) || 'ag'), 'tool_effect_idempotency_key_check',
    'one letter past f');
SELECT is(pg_temp.rule(idempotency_key => repeat('a', 63)), 'tool_effect_idempotency_key_check', '63 digits');
SELECT is(pg_temp.rule(idempotency_key => repeat('a', 65)), 'tool_effect_idempotency_key_check', '65 digits');
SELECT is(pg_temp.rule(idempotency_key => repeat('a', 63) || 'é'), 'tool_effect_idempotency_key_check',
    '63 digits and a letter of two bytes');

-- The constraint binds direct writes, with the message a failed CHECK gives.
SELECT pg_temp.running() AS r \gset
INSERT INTO runrow.agent_step (run_id, seq, kind, payload, attempt)
VALUES (:'r', 1, 'model_turn', '[{"type": "text", "text": "x"}]', 1);
SELECT throws_ok(format($$INSERT INTO runrow.tool_effect (idempotency_key, run_id, step_seq, tool_use_id, tool,
        args, effect, state, attempt) VALUES (%L, %L, 1, 'toolu_1', 'echo', '{}', 'pure', 'executing', 1)$$,
        upper(repeat('ab', 32)), :'r'),
    '23514', 'new row for relation "tool_effect" violates check constraint "tool_effect_idempotency_key_check"',
    'a direct INSERT with an uppercase key is refused');
SELECT lives_ok(format($$INSERT INTO runrow.tool_effect (idempotency_key, run_id, step_seq, tool_use_id, tool,
        args, effect, state, attempt) VALUES (%L, %L, 1, 'toolu_1', 'echo', '{}', 'pure', 'executing', 1)$$,
        repeat('ab', 32), :'r'),
    'a valid direct INSERT is accepted');
SELECT throws_ok(format($$UPDATE runrow.tool_effect SET started_attempt = 0, started_at = now()
        WHERE idempotency_key = %L$$, repeat('ab', 32)),
    '23514', 'new row for relation "tool_effect" violates check constraint "tool_effect_started_attempt_check"',
    'a direct UPDATE that breaks a rule is refused');

SELECT * FROM finish();
ROLLBACK;
