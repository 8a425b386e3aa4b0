-- runrow.get_conversation and the conversation ownership rules (migration 0004).
BEGIN;
\ir helpers/setup.psql
SELECT plan(12);

\set conv '''cccccccc-0000-0000-0000-000000000001'''
SELECT run_id AS r1 FROM runrow.enqueue_run(:conv, '"hi"', 'm', user_id => 'alice') \gset
SELECT is((SELECT user_id FROM runrow.get_conversation(:conv)), 'alice', 'the first enqueue makes its user the owner');
SELECT is((SELECT active_run_id FROM runrow.get_conversation(:conv)), :'r1'::uuid, 'the active run is reported');
SELECT is((SELECT runs FROM runrow.get_conversation(:conv)), 1::bigint, 'one run so far');
SELECT lives_ok($$SELECT * FROM runrow.enqueue_run('cccccccc-0000-0000-0000-000000000001', '"again"', 'm', user_id => 'alice')$$,
    'the owner adds a turn');

SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run('cccccccc-0000-0000-0000-000000000001', '"mine now"', 'm', user_id => 'mallory')$$,
    '42501', 'conversation_id cccccccc-0000-0000-0000-000000000001 belongs to another user',
    'another user cannot add a turn');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run('cccccccc-0000-0000-0000-000000000001', '"anon"', 'm')$$,
    '42501', NULL, 'an anonymous enqueue cannot join an owned conversation');
SELECT is(pg_temp.fingerprint(), :'before', 'the refused enqueues wrote nothing');

-- The schema, not only enqueue_run, holds the rule: even the owner of the tables cannot.
SELECT throws_ok($$INSERT INTO runrow.agent_run (conversation_id, user_id, user_message_id, model, prompt_id)
    SELECT conversation_id, 'mallory', user_message_id, model, prompt_id FROM runrow.agent_run
    WHERE conversation_id = 'cccccccc-0000-0000-0000-000000000001' LIMIT 1$$,
    '42501', NULL, 'a direct insert of another user''s run into the conversation fails');
SELECT throws_ok($$UPDATE runrow.conversation SET user_id = 'mallory' WHERE id = 'cccccccc-0000-0000-0000-000000000001'$$,
    '23000', NULL, 'the owner never changes');
SELECT throws_ok($$DELETE FROM runrow.conversation WHERE id = 'cccccccc-0000-0000-0000-000000000001'$$,
    '23000', NULL, 'conversations are never deleted');

SELECT throws_ok($$SELECT * FROM runrow.get_conversation(NULL)$$, '22004', 'conversation_id must not be NULL',
    'NULL conversation_id');
SELECT throws_ok($$SELECT * FROM runrow.get_conversation('cccccccc-0000-0000-0000-0000000000ff')$$, 'P0002',
    'conversation_id cccccccc-0000-0000-0000-0000000000ff does not exist', 'unknown conversation_id');

SELECT * FROM finish();
ROLLBACK;
