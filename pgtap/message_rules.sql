-- message's row rules (migration 0056): one CHECK constraint, message_rules, whose expression
-- calls runrow._message_rules_valid. Each rule refuses its row with the error and constraint
-- name the three CHECKs it replaced gave, in their (name) order; a NULL passes, as in a CHECK.
-- Rows are written directly, as the tests' role (the owner's rights): the rules bind everyone,
-- not only enqueue_run.
BEGIN;
\ir helpers/setup.psql
SELECT plan(15);

SELECT results_eq(
    $$SELECT conname::text COLLATE "default", convalidated FROM pg_constraint
      WHERE conrelid = 'runrow.message'::regclass AND contype = 'c'$$,
    $$VALUES ('message_rules', true)$$,
    'message has one CHECK constraint, validated');
SELECT ok(pg_get_constraintdef((SELECT oid FROM pg_constraint WHERE conname = 'message_rules'))
    ~ '^CHECK \(runrow\._message_rules_valid\(', 'its expression is one call of _message_rules_valid');
SELECT ok(NOT has_function_privilege('runrow_client', 'runrow._message_rules_valid(text, jsonb, text)', 'EXECUTE'),
    'no runrow role may call the function itself');

CREATE FUNCTION pg_temp.rule(role text, content jsonb, status text) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    name text;
BEGIN
    PERFORM runrow._message_rules_valid(role, content, status);
    RETURN 'valid';
EXCEPTION WHEN check_violation THEN
    GET STACKED DIAGNOSTICS name = CONSTRAINT_NAME;
    RETURN name;
END
$fn$;
SELECT is(pg_temp.rule('user', '"hi"', 'submitted'), 'valid', 'a submitted text message is valid');
SELECT is(pg_temp.rule('user', '[{"type": "text", "text": "hi"}]', 'draft'), 'valid', 'a draft of blocks is valid');
SELECT is(pg_temp.rule(NULL, NULL, NULL), 'valid', 'NULLs pass, as in a CHECK');
SELECT is(pg_temp.rule('user', '""', 'submitted'), 'message_content_check', 'an empty string');
SELECT is(pg_temp.rule('user', '[]', 'submitted'), 'message_content_check', 'an empty array');
SELECT is(pg_temp.rule('user', '{"text": "hi"}', 'submitted'), 'message_content_check', 'an object');
SELECT is(pg_temp.rule('assistant', '"hi"', 'submitted'), 'message_role_check', 'another role');
SELECT is(pg_temp.rule('user', '"hi"', 'sent'), 'message_status_check', 'an unknown status');
SELECT is(pg_temp.rule('system', '7', 'sent'), 'message_content_check',
    'of three broken rules the first by name is reported, as PostgreSQL orders CHECKs');

-- The constraint binds direct writes, with the message a failed CHECK gives.
SELECT throws_ok($$INSERT INTO runrow.message (conversation_id, content) VALUES (gen_random_uuid(), '""')$$,
    '23514', 'new row for relation "message" violates check constraint "message_content_check"',
    'a direct INSERT of an empty message is refused');
SELECT throws_ok($$INSERT INTO runrow.message (conversation_id, content, role) VALUES (gen_random_uuid(), '"x"', 'tool')$$,
    '23514', 'new row for relation "message" violates check constraint "message_role_check"',
    'a direct INSERT with another role is refused');
SELECT lives_ok($$INSERT INTO runrow.message (conversation_id, content) VALUES (gen_random_uuid(), '"x"')$$,
    'a valid direct INSERT is accepted');

SELECT * FROM finish();
ROLLBACK;
