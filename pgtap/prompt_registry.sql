-- The prompt registry (runrow.prompt, _pin_prompt): content-addressed, immutable, never
-- deleted (a run's prompt is checked once, at its insert: 0050), and a run keeps its prompt
-- when a new one is registered (deploying a prompt never changes a run in flight).
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(24);
SELECT pg_temp.drain_queue();

CREATE FUNCTION pg_temp.enqueue(conv uuid, sys text, tools jsonb) RETURNS uuid LANGUAGE sql AS $$
    SELECT run_id FROM runrow.enqueue_run(conversation_id => conv, content => '"hi"', model => 'm',
        system_prompt => sys, tools => tools)
$$;
CREATE FUNCTION pg_temp.prompt_of(run uuid) RETURNS text LANGUAGE sql AS $$
    SELECT prompt_id FROM runrow.agent_run WHERE id = run
$$;
\set conv '''dddddddd-0000-0000-0000-000000000001'''
\set tools_a '''[{"name": "search", "input_schema": {"type": "object", "properties": {}}}]'''
\set tools_a_reordered '''[ {"input_schema":{"properties":{},"type":"object"},"name":"search"} ]'''

SELECT pg_temp.enqueue(:conv, 'You are v1.', :tools_a) AS r1 \gset
SELECT pg_temp.prompt_of(:'r1') AS p1 \gset
SELECT is(:'p1', encode(sha256(convert_to(jsonb_build_object('system', 'You are v1.', 'tools', :tools_a::jsonb)::text, 'UTF8')), 'hex'),
    'a prompt''s id is the SHA-256 of its content');
SELECT is((SELECT (system_prompt, tools)::text FROM runrow.prompt WHERE id = :'p1'),
    ('You are v1.', :tools_a::jsonb)::text, 'the registry row holds the system prompt and the tool definitions');
SELECT pg_temp.enqueue(gen_random_uuid(), 'You are v1.', :tools_a_reordered) AS r_same \gset
SELECT is(pg_temp.prompt_of(:'r_same'), :'p1', 'the same content with other key order and whitespace is the same prompt');
SELECT is((SELECT count(*)::int FROM runrow.prompt WHERE id = :'p1'), 1, 'stored once');

-- A new prompt deployed while r1 is in flight.
SELECT pg_temp.claim(:'r1') AS tok1 \gset
SELECT runrow.cancel_run(:'r_same');
SELECT pg_temp.enqueue(:conv, 'You are v2.', :tools_a) AS r2 \gset
SELECT isnt(pg_temp.prompt_of(:'r2'), :'p1', 'another system prompt is another prompt');
SELECT pg_temp.enqueue(gen_random_uuid(), 'You are v1.', '[{"name": "search2", "input_schema": {"type": "object"}}]') AS r3 \gset
SELECT isnt(pg_temp.prompt_of(:'r3'), :'p1', 'other tool definitions are another prompt');
SELECT runrow.cancel_run(:'r3');
SELECT is(pg_temp.prompt_of(:'r1'), :'p1', 'the run in flight keeps the prompt it was pinned to');
SELECT pg_temp.expire(:'r1');
SELECT runrow.reap_expired_runs(0);
SELECT is((SELECT count(*)::int FROM runrow.agent_run WHERE id = :'r1' AND status = 'failed'), 1, 'r1 failed (at most once)');
SELECT runrow.retry_run(:'r1') AS r1b \gset
SELECT runrow.cancel_run(:'r2');
CREATE TEMP TABLE resumed AS SELECT * FROM runrow.claim_run('w2');
SELECT is((SELECT (run_id, system_prompt, tools)::text FROM resumed), (:'r1b'::uuid, 'You are v1.', :tools_a::jsonb)::text,
    'its retry, claimed after v2 was registered, gets v1''s system prompt and tools from the registry');

-- Immutable and never deleted, even by the owner (0050: a foreign key kept a referenced one
-- until then, and locked its row on every enqueue).
SELECT throws_ok(format('UPDATE runrow.prompt SET system_prompt = ''You are evil.'' WHERE id = %L', :'p1'), '23000',
    format('prompt %s is immutable: register a new prompt instead', :'p1'), 'a prompt cannot be changed');
SELECT throws_ok(format('DELETE FROM runrow.prompt WHERE id = %L', :'p1'), '23000',
    format('prompt %s is never deleted: runs refer to it by its id', :'p1'), 'a referenced prompt cannot be deleted');
INSERT INTO runrow.prompt (id, system_prompt, tools) VALUES (repeat('b', 64), 'unused', '[]');
SELECT throws_ok(format('DELETE FROM runrow.prompt WHERE id = %L', repeat('b', 64)), '23000',
    format('prompt %s is never deleted: runs refer to it by its id', repeat('b', 64)),
    'nor one no run refers to yet: the next enqueue may pin it without a lock');
SELECT throws_ok('TRUNCATE runrow.prompt CASCADE', '23000', 'prompt cannot be truncated', 'the registry cannot be truncated');
-- A run whose prompt does not exist is refused as the foreign key refused it.
SELECT throws_ok(format($$INSERT INTO runrow.agent_run (conversation_id, user_message_id, model, prompt_id)
        SELECT conversation_id, user_message_id, model, repeat('c', 64) FROM runrow.agent_run WHERE id = %L$$, :'r1'),
    '23503', 'insert or update on table "agent_run" violates foreign key constraint "agent_run_prompt_id_fkey"',
    'a run naming a prompt that does not exist is refused, even for the owner');
SELECT is((SELECT count(*)::int FROM pg_constraint WHERE conrelid = 'runrow.agent_run'::regclass
    AND confrelid IN ('runrow.prompt'::regclass, 'runrow.conversation'::regclass, 'runrow.message'::regclass)), 0,
    'no foreign key locks the prompt, conversation or message row of every enqueue');
-- The run's other references, checked in the same look (0052): a missing conversation or message
-- is refused as their foreign keys refused it, and neither table can be emptied under its runs.
SELECT throws_ok(format($$INSERT INTO runrow.agent_run (conversation_id, user_message_id, model, prompt_id)
        SELECT 'dddddddd-0000-0000-0000-0000000000ff', user_message_id, model, prompt_id
        FROM runrow.agent_run WHERE id = %L$$, :'r1'),
    '23503', 'insert or update on table "agent_run" violates foreign key constraint "agent_run_conversation_fk"',
    'a run in a conversation that does not exist is refused');
SELECT throws_ok(format($$INSERT INTO runrow.agent_run (conversation_id, user_message_id, model, prompt_id)
        SELECT conversation_id, 'dddddddd-0000-0000-0000-0000000000fe', model, prompt_id
        FROM runrow.agent_run WHERE id = %L$$, :'r1'),
    '23503', 'insert or update on table "agent_run" violates foreign key constraint "agent_run_user_message_id_fkey"',
    'a run for a message that does not exist is refused');
SELECT throws_ok(format($$INSERT INTO runrow.agent_run (conversation_id, user_id, user_message_id, model, prompt_id)
        SELECT 'dddddddd-0000-0000-0000-0000000000ff', 'someone', user_message_id, model, prompt_id
        FROM runrow.agent_run WHERE id = %L$$, :'r1'),
    '42501', NULL, 'a user''s run in a conversation that does not exist: the owner check comes first, as before');
SELECT throws_ok('TRUNCATE runrow.conversation CASCADE', '23000', 'conversation cannot be truncated',
    'conversations cannot be truncated');
SELECT throws_ok('TRUNCATE runrow.message CASCADE', '23000', 'message cannot be truncated',
    'messages cannot be truncated');
SELECT is((SELECT count(*)::int FROM runrow.agent_run WHERE id = :'r1'), 1, 'nothing was written or removed');
SELECT throws_ok('SELECT pg_temp.as_role(''runrow_worker'', ''INSERT INTO runrow.prompt (id, tools) VALUES (repeat(''''a'''', 64), ''''[]'''')'')',
    '42501', NULL, 'the worker role cannot register prompts directly');
SELECT throws_ok('SELECT pg_temp.as_role(''runrow_client'', ''SELECT 1 FROM runrow.prompt'')', '42501', NULL,
    'the client role cannot read the registry directly');
SELECT lives_ok('SELECT pg_temp.as_role(''runrow_auditor'', ''SELECT 1 FROM runrow.prompt'')', 'the auditor reads the registry');

SELECT * FROM finish();
ROLLBACK;
