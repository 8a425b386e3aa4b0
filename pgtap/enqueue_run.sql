-- runrow.enqueue_run: the rows one enqueue writes, prompt pinning, idempotency,
-- if_active (enqueue / reject / interrupt), bad input for every argument.
BEGIN;
\ir helpers/setup.psql
\ir helpers/row_versions.psql
SELECT plan(104);
SELECT pg_temp.drain_queue();

\set sig '''{uuid,jsonb,text,text,text,jsonb,integer,text,text,jsonb,interval,integer,text,text,text,bigint,numeric,text}'''
SELECT has_function('runrow', 'enqueue_run', :sig::name[], 'enqueue_run(...) exists with the contract''s arguments');
SELECT is_definer('runrow', 'enqueue_run', :sig::name[], 'enqueue_run is SECURITY DEFINER');
SELECT function_privs_are('runrow', 'enqueue_run', :sig::name[], 'runrow_client', ARRAY['EXECUTE'],
    'runrow_client may enqueue');
SELECT function_privs_are('runrow', 'enqueue_run', :sig::name[], 'runrow_worker', ARRAY[]::name[],
    'runrow_worker may not enqueue');
SELECT function_privs_are('runrow', 'enqueue_run', :sig::name[], 'public', ARRAY[]::name[],
    'PUBLIC may not enqueue');

-- Happy path, as the client role: one message, one queued run, two journal events.
\set conv '''bbbbbbbb-0000-0000-0000-000000000001'''
SET LOCAL ROLE runrow_client;
CREATE TEMP TABLE e1 AS SELECT * FROM runrow.enqueue_run(
    conversation_id => :conv, content => '"first question"', model => 'claude-test',
    user_id => 'u1', system_prompt => 'You are terse.',
    tools => '[{"name": "search", "input_schema": {"type": "object"}}]',
    max_attempts => 3, idempotency_key => 'key-1', metadata => '{"source": "pgtap"}');
RESET ROLE;
SELECT run_id AS r1 FROM e1 \gset
SELECT is((SELECT (status, created)::text FROM e1), '(queued,t)', 'returns status queued and created = true');
SELECT is(
    (SELECT (a.conversation_id, a.user_id, a.status, a.attempt, a.max_attempts, a.model,
             a.idempotency_key, a.metadata, a.cancel_requested, a.worker_id, a.claim_token,
             a.claim_expires_at, a.started_at, a.finished_at, a.result, a.error, a.retry_of,
             a.created_at = now())::text
     FROM runrow.agent_run AS a WHERE a.id = :'r1'),
    (SELECT (:conv::uuid, 'u1', 'queued', 0, 3, 'claude-test', 'key-1', '{"source": "pgtap"}'::jsonb,
             false, NULL::text, NULL::uuid, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
             NULL::jsonb, NULL::text, NULL::uuid, true)::text),
    'the run row holds the arguments, attempt 0, no claim, no ending');
SELECT is(
    (SELECT q.snapshot FROM runrow.run_request AS q WHERE q.run_id = :'r1'),
    '{"content": "first question", "metadata": {"source": "pgtap"}}'::jsonb,
    'the request snapshot (run_request) keeps content and metadata');
SELECT is(
    (SELECT (m.conversation_id, m.user_id, m.role, m.content, m.status)::text
     FROM runrow.message AS m JOIN runrow.agent_run AS a ON a.user_message_id = m.id WHERE a.id = :'r1'),
    (SELECT (:conv::uuid, 'u1', 'user', '"first question"'::jsonb, 'submitted')::text),
    'the user message is written, submitted, linked from the run');
SELECT is((SELECT count(*)::int FROM runrow.message AS m WHERE m.conversation_id = :conv), 1,
    'exactly one message');
SELECT results_eq(
    format('SELECT e.seq, e.type, e.payload FROM runrow.run_event AS e WHERE e.run_id = %L ORDER BY e.seq', :'r1'),
    format($q$VALUES (1::bigint, 'user_message_created'::text,
                      jsonb_build_object('type', 'user_message_created', 'message_id', %L::uuid)),
                     (2::bigint, 'run_queued'::text,
                      jsonb_build_object('type', 'run_queued', 'run_id', %L::uuid))$q$,
           (SELECT a.user_message_id FROM runrow.agent_run AS a WHERE a.id = :'r1'), :'r1'),
    'journal: seq 1 user_message_created (message id), seq 2 run_queued (run id), nothing else');

-- Prompt pinning: content-addressed, deduplicated, immutable registry rows.
SELECT a.prompt_id AS p1 FROM runrow.agent_run AS a WHERE a.id = :'r1' \gset
SELECT is(:'p1',
    encode(sha256(convert_to(jsonb_build_object('system', 'You are terse.',
        'tools', '[{"name": "search", "input_schema": {"type": "object"}}]'::jsonb)::text, 'UTF8')), 'hex'),
    'the prompt id is the SHA-256 of the canonical {system, tools}');
SELECT is(
    (SELECT (p.system_prompt, p.tools)::text FROM runrow.prompt AS p WHERE p.id = :'p1'),
    (SELECT ('You are terse.', '[{"name": "search", "input_schema": {"type": "object"}}]'::jsonb)::text),
    'the prompt row holds the system prompt and the tools');
SELECT pg_temp.fingerprint() AS before_same \gset
SELECT run_id AS r2 FROM runrow.enqueue_run(
    conversation_id => gen_random_uuid(), content => '"x"', model => 'other-model',
    system_prompt => 'You are terse.',
    -- Same tools, different key order and whitespace: the same canonical content.
    tools => '[{"input_schema":{"type":"object"},   "name":"search"}]') \gset
SELECT is((SELECT a.prompt_id FROM runrow.agent_run AS a WHERE a.id = :'r2'), :'p1',
    'the same system prompt and tools pin the same prompt id');
SELECT is((SELECT count(*)::int FROM runrow.prompt), split_part(:'before_same', ',', 4)::int,
    'and add no prompt row');
SELECT run_id AS r3 FROM runrow.enqueue_run(
    conversation_id => gen_random_uuid(), content => '"x"', model => 'claude-test',
    system_prompt => 'You are terse.', tools => '[{"name": "fetch", "input_schema": {"type": "object"}}]') \gset
SELECT isnt((SELECT a.prompt_id FROM runrow.agent_run AS a WHERE a.id = :'r3'), :'p1',
    'different tools pin a different prompt id');
SELECT run_id AS r4 FROM runrow.enqueue_run(
    conversation_id => gen_random_uuid(), content => '"x"', model => 'claude-test',
    system_prompt => 'You are verbose.',
    tools => '[{"name": "search", "input_schema": {"type": "object"}}]') \gset
SELECT isnt((SELECT a.prompt_id FROM runrow.agent_run AS a WHERE a.id = :'r4'), :'p1',
    'a different system prompt pins a different prompt id');
SELECT is((SELECT count(*)::int FROM runrow.prompt), split_part(:'before_same', ',', 4)::int + 2,
    'each new prompt adds one registry row');
SELECT run_id AS r5 FROM runrow.enqueue_run(
    conversation_id => gen_random_uuid(), content => '"x"', model => 'm') \gset
SELECT is(
    (SELECT (p.system_prompt, p.tools)::text FROM runrow.prompt AS p
     JOIN runrow.agent_run AS a ON a.prompt_id = p.id WHERE a.id = :'r5'),
    (SELECT (NULL::text, '[]'::jsonb)::text),
    'defaults pin a prompt with no system prompt and no tools');
SELECT is(
    (SELECT (a.user_id, a.max_attempts, a.idempotency_key, a.metadata)::text
     FROM runrow.agent_run AS a WHERE a.id = :'r5'),
    (SELECT (NULL::text, 1, NULL::text, '{}'::jsonb)::text),
    'defaults: no user, one attempt, no idempotency key, empty metadata');
SELECT throws_ok(format('UPDATE runrow.prompt SET system_prompt = %L WHERE id = %L', 'changed', :'p1'),
    '23000', format('prompt %s is immutable: register a new prompt instead', :'p1'),
    'a pinned prompt cannot be changed afterwards');

-- Content: a string or an array of content blocks, stored verbatim.
SELECT run_id AS r6 FROM runrow.enqueue_run(
    conversation_id => gen_random_uuid(),
    content => '[{"type": "text", "text": "look"}, {"type": "image", "source": {"type": "url", "url": "u"}}]',
    model => 'm') \gset
SELECT is(
    (SELECT m.content FROM runrow.message AS m JOIN runrow.agent_run AS a ON a.user_message_id = m.id
     WHERE a.id = :'r6'),
    '[{"type": "text", "text": "look"}, {"type": "image", "source": {"type": "url", "url": "u"}}]'::jsonb,
    'an array of content blocks is stored as given');

-- Idempotency: the same key with the same request returns the first run and writes nothing.
SELECT is((SELECT a.request_fingerprint ~ '^[0-9a-f]{64}$' FROM runrow.agent_run AS a WHERE a.id = :'r1'), true,
    'a run enqueued with a key keeps the fingerprint of its request');
SELECT pg_temp.written() AS before \gset
SELECT is(
    (SELECT (run_id, status, created)::text FROM runrow.enqueue_run(
        conversation_id => :conv, content => '"first question"', model => 'claude-test',
        user_id => 'u1', system_prompt => 'You are terse.',
        -- The same JSON, other key order and whitespace: the same request.
        tools => '[{"input_schema":{"type":"object"},"name":"search"}]',
        max_attempts => 3, idempotency_key => 'key-1', if_active => 'enqueue', metadata => '{"source":"pgtap"}')),
    (SELECT (:'r1'::uuid, 'queued', false)::text),
    'the same idempotency key with the same request returns the first run with created = false');
SELECT is(pg_temp.written(), :'before', 'and writes no second message, run, event or prompt');
SELECT is(
    (SELECT (run_id, created)::text FROM runrow.enqueue_run(
        conversation_id => :conv, content => '"first question"', model => 'claude-test',
        user_id => 'u1', system_prompt => 'You are terse.',
        tools => '[{"input_schema":{"type":"object"},"name":"search"}]', max_attempts => 3,
        idempotency_key => 'key-1',
        metadata => '{"source":"pgtap", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}')),
    (SELECT (:'r1'::uuid, false)::text),
    'a retry from another span (a traceparent added) is the same request: the first run');
-- The same key with a request that differs in any one argument: 23505, naming the key.
CREATE FUNCTION pg_temp.replay_refused(args text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format($q$SELECT * FROM runrow.enqueue_run(conversation_id => 'bbbbbbbb-0000-0000-0000-000000000001',
        idempotency_key => 'key-1', user_id => 'u1', %s)$q$, args);
    RETURN 'replayed';
EXCEPTION WHEN unique_violation THEN
    GET STACKED DIAGNOSTICS args = MESSAGE_TEXT;
    RETURN args;
END $$;
\set same_prompt 'system_prompt => ''You are terse.'', tools => ''[{"name": "search", "input_schema": {"type": "object"}}]'''
SELECT is(
    (SELECT array_agg(DISTINCT pg_temp.replay_refused(v.args)) FROM (VALUES
        ($$content => '"another question"', model => 'claude-test', max_attempts => 3, metadata => '{"source": "pgtap"}', $$ || :'same_prompt'),
        ($$content => '"first question"', model => 'other-model', max_attempts => 3, metadata => '{"source": "pgtap"}', $$ || :'same_prompt'),
        ($$content => '"first question"', model => 'claude-test', max_attempts => 3, metadata => '{"source": "pgtap"}', system_prompt => 'Be long.', tools => '[{"name": "search", "input_schema": {"type": "object"}}]'$$),
        ($$content => '"first question"', model => 'claude-test', max_attempts => 3, metadata => '{"source": "pgtap"}', system_prompt => 'You are terse.'$$),
        ($$content => '"first question"', model => 'claude-test', max_attempts => 2, metadata => '{"source": "pgtap"}', $$ || :'same_prompt'),
        ($$content => '"first question"', model => 'claude-test', max_attempts => 3, metadata => '{"source": "pgtap"}', if_active => 'reject', $$ || :'same_prompt'),
        ($$content => '"first question"', model => 'claude-test', max_attempts => 3, metadata => '{}', $$ || :'same_prompt')
    ) AS v (args)),
    ARRAY[format('idempotency_key "key-1" is already used by a different request (run %s)', :'r1')],
    'a different content, model, system_prompt, tools, max_attempts, if_active or metadata is refused');
SELECT throws_ok(
    $$SELECT * FROM runrow.enqueue_run(conversation_id => 'bbbbbbbb-0000-0000-0000-000000000001',
        content => '"a different question"', model => 'claude-test', user_id => 'u1', idempotency_key => 'key-1')$$,
    '23505', format('idempotency_key "key-1" is already used by a different request (run %s)', :'r1'),
    'the refusal is 23505 unique_violation');
SELECT is(pg_temp.written(), :'before', 'the refused reuses wrote nothing');
SELECT throws_ok(
    $$SELECT * FROM runrow.enqueue_run(conversation_id => gen_random_uuid(), content => '"q"',
        model => 'claude-test', user_id => 'u1', idempotency_key => 'key-1')$$,
    '23505', 'idempotency_key "key-1" is already used by a run of another conversation or user',
    'a key reused by another conversation is refused');
SELECT throws_ok(
    format($$SELECT * FROM runrow.enqueue_run(conversation_id => %L, content => '"q"',
        model => 'claude-test', user_id => 'u2', idempotency_key => 'key-1')$$, :conv),
    '23505', 'idempotency_key "key-1" is already used by a run of another conversation or user',
    'a key reused by another user of the same conversation is refused');
SELECT is(pg_temp.written(), :'before', 'the rejected reuses wrote nothing');
-- No key: every enqueue is its own run, and keeps no fingerprint.
SELECT run_id AS nk1 FROM runrow.enqueue_run(conversation_id => gen_random_uuid(), content => '"same"', model => 'm') \gset
SELECT run_id AS nk2 FROM runrow.enqueue_run(conversation_id => gen_random_uuid(), content => '"same"', model => 'm') \gset
SELECT is((SELECT count(DISTINCT a.id)::int FROM runrow.agent_run AS a WHERE a.id IN (:'nk1', :'nk2')
           AND a.request_fingerprint IS NULL), 2,
    'without a key the same request twice is two runs, with no fingerprint');
-- A run enqueued before migration 0010 has no fingerprint: its key replays as it always did.
SELECT run_id AS old FROM runrow.enqueue_run(conversation_id => gen_random_uuid(), content => '"old"', model => 'm',
    idempotency_key => 'key-old') \gset
UPDATE runrow.agent_run SET request_fingerprint = NULL WHERE id = :'old';
SELECT is((SELECT (run_id, created)::text FROM runrow.enqueue_run(
        conversation_id => (SELECT a.conversation_id FROM runrow.agent_run AS a WHERE a.id = :'old'),
        content => '"something else"', model => 'm', idempotency_key => 'key-old')),
    (SELECT (:'old'::uuid, false)::text), 'a run without a fingerprint replays its key whatever the request');

-- if_active = enqueue (the default): the new turn waits behind the active one.
SELECT run_id AS r7 FROM runrow.enqueue_run(conversation_id => :conv, content => '"second"', model => 'm', user_id => 'u1') \gset
SELECT is(
    (SELECT array_agg(a.status ORDER BY a.enqueue_seq) FROM runrow.agent_run AS a WHERE a.conversation_id = :conv),
    ARRAY['queued', 'queued'], 'if_active = enqueue queues the turn behind the active one');
SELECT ok(
    (SELECT a2.enqueue_seq > a1.enqueue_seq FROM runrow.agent_run AS a1, runrow.agent_run AS a2
     WHERE a1.id = :'r1' AND a2.id = :'r7'),
    'in enqueue order');

-- if_active = reject: 55000, nothing written, whatever the active run's status.
SELECT pg_temp.written() AS before \gset
SELECT throws_ok(
    format($$SELECT * FROM runrow.enqueue_run(conversation_id => %L, content => '"third"', model => 'm', user_id => 'u1',
        if_active => 'reject')$$, :conv),
    '55000', format('conversation %s already has an active run (if_active = reject)', :conv),
    'if_active = reject raises 55000 while a turn is queued');
SELECT is(pg_temp.written(), :'before', 'the rejected enqueue wrote nothing');
SELECT pg_temp.claim(:'r1') AS tok1 \gset
SELECT throws_ok(
    format($$SELECT * FROM runrow.enqueue_run(conversation_id => %L, content => '"third"', model => 'm', user_id => 'u1',
        if_active => 'reject')$$, :conv),
    '55000', NULL, 'if_active = reject raises 55000 while a turn is running');
SELECT is(
    (SELECT (status, created)::text FROM runrow.enqueue_run(conversation_id => gen_random_uuid(),
        content => '"q"', model => 'm', if_active => 'reject')),
    '(queued,t)', 'if_active = reject enqueues when nothing is active');

-- if_active = interrupt: stop the active runs as stop_conversation does, then enqueue.
-- Other conversations' turns out of the way first, so the claims below are predictable.
SELECT count(*) AS stopped_others
FROM (SELECT DISTINCT a.conversation_id FROM runrow.agent_run AS a
      WHERE a.status = 'queued' AND a.conversation_id <> :conv) AS c,
     LATERAL runrow.stop_conversation(c.conversation_id) AS s \gset
SELECT run_id AS r8 FROM runrow.enqueue_run(
    conversation_id => :conv, content => '"interrupting"', model => 'm', user_id => 'u1', if_active => 'interrupt') \gset
SELECT is(
    (SELECT (a.status, a.cancel_requested, a.claim_token = :'tok1'::uuid)::text
     FROM runrow.agent_run AS a WHERE a.id = :'r1'),
    '(running,t,t)', 'interrupt: the running turn keeps its claim and gets cancel_requested');
SELECT is(
    (SELECT e.payload FROM runrow.run_event AS e WHERE e.run_id = :'r1' ORDER BY e.seq DESC LIMIT 1),
    '{"type": "cancel_requested"}'::jsonb, 'interrupt: cancel_requested is journaled on the running turn');
SELECT is(
    (SELECT (a.status, a.cancel_requested, a.finished_at = now(), a.error, m.status)::text
     FROM runrow.agent_run AS a JOIN runrow.message AS m ON m.id = a.user_message_id WHERE a.id = :'r7'),
    '(cancelled,t,t,"stopped before it finished",draft)',
    'interrupt: the queued turn is cancelled and its message handed back as a draft');
SELECT is(
    (SELECT e.payload FROM runrow.run_event AS e WHERE e.run_id = :'r7' ORDER BY e.seq DESC LIMIT 1),
    '{"type": "complete", "status": "cancelled", "result": null, "error": "stopped before it finished"}'::jsonb,
    'interrupt: the cancelled turn journals its complete event');
SELECT is(
    (SELECT (a.status, m.status)::text FROM runrow.agent_run AS a
     JOIN runrow.message AS m ON m.id = a.user_message_id WHERE a.id = :'r8'),
    '(queued,submitted)', 'interrupt: the new turn is queued with a submitted message');
SELECT results_eq(
    format('SELECT e.seq, e.type FROM runrow.run_event AS e WHERE e.run_id = %L ORDER BY e.seq', :'r8'),
    $$VALUES (1::bigint, 'user_message_created'::text), (2::bigint, 'run_queued'::text)$$,
    'interrupt: the new turn has the usual two journal events');
SELECT is_empty('SELECT * FROM runrow.claim_run(''w'')',
    'interrupt: the new turn waits until the running turn ends');
SELECT ok(runrow.finish_run(:'r1', :'tok1', 'cancelled'), 'the interrupted worker finalizes cancelled');
SELECT is((SELECT run_id FROM runrow.claim_run('w')), :'r8'::uuid, 'then the new turn is claimable');

-- Interrupt of a waiting (parked) turn cancels it outright too.
\set conv2 '''bbbbbbbb-0000-0000-0000-000000000002'''
SELECT pg_temp.new_run(:conv2) AS w1 \gset
SELECT pg_temp.claim(:'w1') AS wtok \gset
UPDATE runrow.agent_run SET status = 'waiting', claim_token = NULL, claim_expires_at = NULL WHERE id = :'w1';
SELECT run_id AS w2 FROM runrow.enqueue_run(
    conversation_id => :conv2, content => '"next"', model => 'm', if_active => 'interrupt') \gset
SELECT is(
    (SELECT (a.status, m.status)::text FROM runrow.agent_run AS a
     JOIN runrow.message AS m ON m.id = a.user_message_id WHERE a.id = :'w1'),
    '(cancelled,draft)', 'interrupt: a waiting turn is cancelled and its message becomes a draft');
SELECT is((SELECT run_id FROM runrow.claim_run('w')), :'w2'::uuid,
    'interrupt: the new turn after a waiting one is claimable at once');

-- Bad input: each argument, the SQLSTATE, the message naming it, nothing written.
SELECT pg_temp.written() AS before \gset
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(NULL, '"q"', 'm')$$,
    '22004', 'conversation_id must not be NULL', 'conversation_id NULL');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), NULL, 'm')$$,
    '22004', 'content must not be NULL', 'content NULL');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '""', 'm')$$,
    '22023', 'content must be a non-empty string or a non-empty array of content blocks', 'content empty string');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '[]', 'm')$$,
    '22023', 'content must be a non-empty string or a non-empty array of content blocks', 'content empty array');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '{"text": "q"}', 'm')$$,
    '22023', 'content must be a non-empty string or a non-empty array of content blocks', 'content object');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), 'null', 'm')$$,
    '22023', 'content must be a non-empty string or a non-empty array of content blocks', 'content JSON null');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), to_jsonb(repeat('x', 1048576)), 'm')$$,
    '22023', 'content is too large: 1048578 bytes, the limit is 1 MiB', 'content over 1 MiB');
-- Over the limit and made of many blocks: the size is checked before the blocks are walked
-- (80,000 blocks cost 6.2 s of the backend before the size refused them).
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(),
        (SELECT jsonb_agg(jsonb_build_object('type', 'image')) FROM generate_series(1, 80000)), 'm')$$,
    '22023', 'content is too large: 1520000 bytes, the limit is 1 MiB', 'content over 1 MiB of bad blocks');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', NULL)$$,
    '22004', 'model must not be NULL', 'model NULL');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', '')$$,
    '22023', 'model must be a non-empty model name of at most 200 characters', 'model empty');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', repeat('m', 201))$$,
    '22023', 'model must be a non-empty model name of at most 200 characters', 'model of 201 characters');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', user_id => '')$$,
    '22023', 'user_id must be NULL or 1 to 200 characters', 'user_id empty');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', user_id => repeat('u', 201))$$,
    '22023', 'user_id must be NULL or 1 to 200 characters', 'user_id of 201 characters');
SELECT throws_ok(
    $$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', system_prompt => repeat('s', 1048577))$$,
    '22023', 'system_prompt is too large: the limit is 1 MiB', 'system_prompt over 1 MiB');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', tools => NULL)$$,
    '22004', 'tools must not be NULL', 'tools NULL');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', tools => '{"name": "t"}')$$,
    '22023', 'tools must be a JSON array of tool definitions, got object', 'tools object');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', tools => '["search"]')$$,
    '22023', 'tools[0] must be an object with a string "name"', 'tools holding a string');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', tools => '[{"name": 1}]')$$,
    '22023', 'tools[0] must be an object with a string "name"', 'tools with a non-string name');
-- The test is a jsonpath expression since issue 11's stop 44: the shapes where one could slip.
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', tools => '[{"nom": "t"}]')$$,
    '22023', 'tools[0] must be an object with a string "name"', 'a tool without a name');
SELECT throws_ok(
    $$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', tools => '[{"name": "t", "input_schema": {"type": "object"}}, {"x": 1}]')$$,
    '22023', 'tools[1] must be an object with a string "name"', 'a second tool without a name');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', tools => '[[{"name": "t"}]]')$$,
    '22023', 'tools[0] must be an object with a string "name"', 'a tool nested in an array');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', tools => '[{"name": ["t"]}]')$$,
    '22023', 'tools[0] must be an object with a string "name"', 'a name in an array');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', tools => '[{"name": null}]')$$,
    '22023', 'tools[0] must be an object with a string "name"', 'a null name');
SELECT throws_ok(
    $$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm',
        tools => jsonb_build_array(jsonb_build_object('name', 't', 'description', repeat('d', 1048576))))$$,
    '22023', 'tools is too large: the limit is 1 MiB', 'tools over 1 MiB');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', max_attempts => 0)$$,
    '22023', 'max_attempts must be between 1 and 100, got 0', 'max_attempts 0');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', max_attempts => 101)$$,
    '22023', 'max_attempts must be between 1 and 100, got 101', 'max_attempts 101');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', max_attempts => NULL)$$,
    '22004', 'max_attempts must not be NULL', 'max_attempts NULL');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', idempotency_key => '')$$,
    '22023', 'idempotency_key must be NULL or 1 to 255 characters', 'idempotency_key empty');
SELECT throws_ok(
    $$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', idempotency_key => repeat('k', 256))$$,
    '22023', 'idempotency_key must be NULL or 1 to 255 characters', 'idempotency_key of 256 characters');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', if_active => NULL)$$,
    '22004', 'if_active must not be NULL', 'if_active NULL');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', if_active => 'replace')$$,
    '22023', 'if_active must be one of enqueue, reject, interrupt, got "replace"', 'if_active unknown');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', metadata => NULL)$$,
    '22004', 'metadata must not be NULL', 'metadata NULL');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', metadata => '[1]')$$,
    '22023', 'metadata must be a JSON object, got array', 'metadata array');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', metadata => '{"prompt_cache": "10m"}')$$,
    '22023', 'metadata.prompt_cache must be one of "off", "5m", "1h", got "10m"', 'metadata.prompt_cache unknown');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', metadata => '{"prompt_cache": true}')$$,
    '22023', 'metadata.prompt_cache must be one of "off", "5m", "1h", got true', 'metadata.prompt_cache not a string');
-- metadata.traceparent: a W3C traceparent or nothing (a worker would start a new trace for it).
SELECT throws_ok(format($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', metadata => %L)$$, m),
    '22023', NULL, 'metadata.traceparent refused: ' || why)
FROM (VALUES
    ('{"traceparent": 1}', 'not a string'),
    ('{"traceparent": null}', 'null'),
    ('{"traceparent": ""}', 'empty'),
    ('{"traceparent": "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"}', 'uppercase hex'),
    ('{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01"}', 'a short trace id'),
    ('{"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}', 'an all-zero trace id'),
    ('{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"}', 'an all-zero parent id'),
    ('{"traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}', 'version ff'),
    ('{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 "}', 'a trailing space')
) AS t (m, why);
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', metadata => '{"traceparent": "x"}')$$,
    '22023', 'metadata.traceparent must be a W3C traceparent (version-trace_id-parent_id-flags, '
    'lowercase hex, ids not all zero), got "x"', 'the traceparent error names metadata.traceparent');
-- Bad input is rejected before the idempotency lookup and the if_active decision.
SELECT throws_ok(
    format($$SELECT * FROM runrow.enqueue_run(%L, '"q"', 'm', user_id => 'u1', idempotency_key => 'key-1',
        max_attempts => 0)$$, :conv),
    '22023', 'max_attempts must be between 1 and 100, got 0', 'a replay with bad input still raises');
SELECT throws_ok(
    format($$SELECT * FROM runrow.enqueue_run(%L, '"q"', 'm', user_id => 'u1', if_active => 'interrupt', metadata => '1')$$, :conv),
    '22023', 'metadata must be a JSON object, got number', 'a bad interrupt raises before stopping anything');
SELECT is(pg_temp.written(), :'before', 'bad input wrote nothing');
SELECT is((SELECT a.status FROM runrow.agent_run AS a WHERE a.id = :'r8'), 'running',
    'the active turn was not interrupted by the bad enqueue');

-- Boundaries that are accepted.
SELECT is(
    (SELECT created FROM runrow.enqueue_run(gen_random_uuid(), '"q"', repeat('m', 200),
        user_id => repeat('u', 200), max_attempts => 100, idempotency_key => repeat('k', 255))),
    true, 'model/user_id of 200, max_attempts 100, a key of 255 characters are accepted');
SELECT is(
    (SELECT created FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', system_prompt => '', tools => '[]')),
    true, 'an empty system prompt and no tools are accepted');
SELECT run_id AS traced FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm',
    metadata => '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}') \gset
SELECT is(
    (SELECT a.metadata ->> 'traceparent' FROM runrow.agent_run AS a WHERE a.id = :'traced'),
    '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
    'a W3C traceparent is accepted and kept in the run''s metadata');

SELECT lives_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', metadata => '{"prompt_cache": "1h"}')$$,
    'metadata.prompt_cache "1h" is accepted');

SELECT * FROM finish();
ROLLBACK;
