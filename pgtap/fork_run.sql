-- runrow.fork_run: a new conversation whose history is the source's up to a step, copied byte
-- for byte; the thinking a new model must drop; a live source; bad input writes nothing.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/steps.psql
SELECT plan(40);
SELECT pg_temp.drain_queue();

SELECT has_function('runrow', 'fork_run', ARRAY['uuid', 'integer', 'text'], 'fork_run(run_id, at_seq, model) exists');

-- The source conversation (owner alice): turn 1 completed with a signed thinking block and a
-- tool call, turn 2 stopped before it started (a draft: not part of any history), turn 3 the
-- run to fork, four steps with odd whitespace and key order that a jsonb copy would lose.
SELECT gen_random_uuid() AS conv \gset
SELECT run_id AS t1 FROM runrow.enqueue_run(:'conv', '"first"', 'model-a', user_id => 'alice',
    system_prompt => 'sys', tools => '[{"name": "t", "input_schema": {"type": "object"}}]', metadata => '{"max_tokens": 99}') \gset
SELECT pg_temp.claim(:'t1') AS tok1 \gset
SELECT runrow.append_step(:'t1', :'tok1', 'model_turn',
    '[{"type":"thinking","thinking":"hm","signature":"sig-1"},  {"type":"tool_use","id":"tu_1","name":"t","input":{"b":1,"a":2}}]',
    'req_1', usage => '{"input_tokens": 10, "output_tokens": 3}', stop_reason => 'tool_use');
SELECT runrow.append_step(:'t1', :'tok1', 'tool_result', '{"type":"tool_result","tool_use_id":"tu_1","content":"r1"}');
SELECT runrow.append_step(:'t1', :'tok1', 'model_turn', '[{"type":"text","text":"one"}]', 'req_2',
    stop_reason => 'end_turn');
SELECT runrow.finish_run(:'t1', :'tok1', 'completed', '{"text": "one"}');
SELECT run_id AS t2 FROM runrow.enqueue_run(:'conv', '"never ran"', 'model-a', user_id => 'alice') \gset
SELECT runrow.cancel_run(:'t2');
SELECT run_id AS t3 FROM runrow.enqueue_run(:'conv', '[{"type": "text", "text": "third"}]', 'model-a',
    user_id => 'alice', system_prompt => 'sys', tools => '[{"name": "t", "input_schema": {"type": "object"}}]', max_attempts => 3,
    metadata => '{"max_tokens": 99}') \gset
SELECT pg_temp.claim(:'t3') AS tok3 \gset
SELECT runrow.append_step(:'t3', :'tok3', 'model_turn',
    '[{"type":"redacted_thinking","data":"opaque"},{"type":"text","text":"calling"},{"type":"tool_use","id":"tu_3","name":"t","input":{}}]',
    'req_3', usage => '{"input_tokens": 20, "output_tokens": 4}', stop_reason => 'tool_use');
SELECT runrow.append_step(:'t3', :'tok3', 'tool_result', '{"tool_use_id":"tu_3",  "type":"tool_result","content":"r3"}');
SELECT runrow.append_step(:'t3', :'tok3', 'model_turn',
    '[{"type":"thinking","thinking":"again","signature":"sig-3"},{"type":"tool_use","id":"tu_4","name":"t","input":{}}]',
    'req_4', stop_reason => 'tool_use');
SELECT runrow.append_step(:'t3', :'tok3', 'tool_result', '{"type":"tool_result","tool_use_id":"tu_4","content":"r4"}');
SELECT runrow.finish_run(:'t3', :'tok3', 'completed', '{"text": "three"}');

CREATE TEMP TABLE source_rows AS
SELECT to_jsonb(a) AS run FROM runrow.agent_run AS a WHERE a.conversation_id = :'conv';

-- Fork at step 3 of turn 3, same model.
SELECT pg_temp.fingerprint() AS before_fork \gset
SELECT * FROM runrow.fork_run(:'t3', 3) \gset
SELECT isnt(:'new_conversation_id'::uuid, :'conv'::uuid, 'the fork lives in a new conversation');
SELECT is((SELECT user_id FROM runrow.conversation WHERE id = :'new_conversation_id'), 'alice',
    'owned by the source conversation''s user');
SELECT is(:'steps_copied'::int, 6, 'three steps of turn 1 and three of turn 3 copied');
SELECT is(:'must_drop'::jsonb, '[]'::jsonb, 'same model: no block to drop');
SELECT is(
    (SELECT (status, attempt, max_attempts, model, prompt_id, metadata, user_id, forked_from, forked_at_seq, claim_token)::text
     FROM runrow.agent_run WHERE id = :'new_run_id'),
    (SELECT ('queued', 0, max_attempts, model, prompt_id, metadata, user_id, id, 3, NULL::uuid)::text
     FROM runrow.agent_run WHERE id = :'t3'),
    'the fork is queued with the source''s prompt, metadata and attempts, and names what it copies');
SELECT is(
    (SELECT array_agg((status, model, forked_from, forked_at_seq, result)::text ORDER BY enqueue_seq)
     FROM runrow.agent_run WHERE conversation_id = :'new_conversation_id'),
    ARRAY[(SELECT ('completed', 'model-a', :'t1'::uuid, 3, '{"text": "one"}'::jsonb)::text),
          (SELECT ('queued', 'model-a', :'t3'::uuid, 3, NULL::jsonb)::text)],
    'the completed turn 1 comes along as it ended; the draft turn 2 does not');

-- Byte for byte: every copied agent_step row equals its source row but for run_id and created_at.
SELECT is(
    (SELECT array_agg(row(s.seq, s.kind, s.payload::text, s.request_id, s.attempt, s.usage, s.stop_reason, s.tool_use_id)::text
                      ORDER BY a.enqueue_seq, s.seq)
     FROM runrow.agent_run AS a JOIN runrow.agent_step AS s ON s.run_id = a.id
     WHERE a.conversation_id = :'new_conversation_id'),
    (SELECT array_agg(row(s.seq, s.kind, s.payload::text, s.request_id, s.attempt, s.usage, s.stop_reason, s.tool_use_id)::text
                      ORDER BY a.enqueue_seq, s.seq)
     FROM runrow.agent_run AS a JOIN runrow.agent_step AS s ON s.run_id = a.id
     WHERE a.conversation_id = :'conv' AND a.id <> :'t2' AND (a.id <> :'t3' OR s.seq <= 3)),
    'the agent_step rows are copied verbatim, up to at_seq');
-- The model input: conversation_history of the fork is the source's, minus step 4.
SELECT is(
    (SELECT array_agg((h.message_index, h.role, h.source, h.seq, h.kind, h.payload::text)::text)
     FROM runrow.conversation_history(:'new_conversation_id', :'new_run_id') AS h),
    (SELECT array_agg((h.message_index, h.role, h.source, h.seq, h.kind, h.payload::text)::text)
     FROM runrow.conversation_history(:'conv', :'t3') AS h WHERE h.seq IS DISTINCT FROM 4),
    'conversation_history of the fork rebuilds the source''s model input up to step 3, byte for byte');
SELECT is(pg_temp.journal(:'new_run_id'), ARRAY['user_message_created', 'run_queued'], 'the fork''s journal starts fresh');
SELECT is((SELECT payload - 'run_id' FROM runrow.run_event WHERE run_id = :'new_run_id' AND seq = 2),
    jsonb_build_object('type', 'run_queued', 'forked_from', :'t3'::uuid, 'at_seq', 3), 'run_queued names the source and the step');
SELECT is((SELECT array_agg(to_jsonb(a) ORDER BY a.id) FROM runrow.agent_run AS a WHERE a.conversation_id = :'conv'),
    (SELECT array_agg(run ORDER BY run ->> 'id') FROM source_rows), 'the source conversation is untouched');
SELECT is((SELECT count(*)::int FROM runrow.audit() AS x
           WHERE x.run_id IN (SELECT id FROM runrow.agent_run WHERE conversation_id = :'new_conversation_id')),
    0, 'audit finds nothing wrong with the copies');
SELECT is((SELECT string_agg(type, ',' ORDER BY seq) FROM runrow.read_events(
               (SELECT id FROM runrow.agent_run WHERE conversation_id = :'new_conversation_id' AND forked_from = :'t1'))),
    'complete', 'a copied turn reads as ended');

-- The fork runs like any resumed run: claimable, its next step follows the copied ones.
SELECT is((SELECT (run_id, attempt, model, system_prompt)::text FROM runrow.claim_run('w')),
    (:'new_run_id'::uuid, 1, 'model-a', 'sys')::text, 'the fork is claimable with the pinned model and prompt');
SELECT is(runrow.append_step(:'new_run_id', pg_temp.token(:'new_run_id'), 'tool_result',
    '{"type":"tool_result","tool_use_id":"tu_4","content":"the fork''s own"}'), 4, 'the fork''s own step is 4');
SELECT is((SELECT payload::text FROM runrow.agent_step WHERE run_id = :'t3' AND seq = 4),
    '{"type":"tool_result","tool_use_id":"tu_4","content":"r4"}', 'and the source''s step 4 is still its own');

-- Another model: the thinking of every copied turn is listed, nothing else.
SELECT * FROM runrow.fork_run(:'t3', 4, model => 'model-b') \gset other_
SELECT is((SELECT model FROM runrow.agent_run WHERE id = :'other_new_run_id'), 'model-b', 'the fork is pinned to the new model');
SELECT is(
    (SELECT jsonb_agg(d - 'run_id') FROM jsonb_array_elements(:'other_must_drop'::jsonb) AS d),
    '[{"seq": 1, "type": "thinking", "index": 0}, {"seq": 1, "type": "redacted_thinking", "index": 0},
      {"seq": 3, "type": "thinking", "index": 0}]'::jsonb,
    'must_drop lists the thinking and redacted_thinking blocks, by step and index');
SELECT is(
    (SELECT array_agg(DISTINCT d ->> 'run_id') FROM jsonb_array_elements(:'other_must_drop'::jsonb) AS d),
    (SELECT array_agg(id::text ORDER BY id::text) FROM runrow.agent_run WHERE conversation_id = :'other_new_conversation_id'),
    'each names the copied run that holds it');

-- at_seq 0: the user message alone, the turn runs again from the start.
SELECT * FROM runrow.fork_run(:'t3', 0) \gset zero_
SELECT is((SELECT count(*)::int FROM runrow.agent_step WHERE run_id = :'zero_new_run_id'), 0, 'at_seq 0 copies no step of the run');
SELECT is(:'zero_steps_copied'::int, 3, 'only turn 1''s steps');

-- A live source: the fork takes what is written, and what the run writes afterwards stays out.
SELECT pg_temp.drain_queue();
SELECT pg_temp.running() AS live \gset
SELECT pg_temp.tool_turn(:'live', 'tu_live', 't', '{}');
SELECT * FROM runrow.fork_run(:'live', 1) \gset live_
SELECT runrow.append_step(:'live', pg_temp.token(:'live'), 'tool_result', '{"type":"tool_result","tool_use_id":"tu_live","content":"x"}');
SELECT is((SELECT count(*)::int FROM runrow.agent_step WHERE run_id = :'live_new_run_id'), 1,
    'a running source: later steps are not part of the fork');
SELECT is(pg_temp.status(:'live'), 'running', 'and the source keeps running');

-- Bad input: an error naming the argument, nothing written.
SELECT pg_temp.fingerprint() AS before \gset
SELECT count(*) AS steps_before FROM runrow.agent_step \gset
SELECT throws_ok('SELECT * FROM runrow.fork_run(NULL, 1)', '22004', 'run_id must not be NULL', 'NULL run_id');
SELECT throws_ok(format('SELECT * FROM runrow.fork_run(%L, NULL)', :'t3'), '22004', 'at_seq must not be NULL', 'NULL at_seq');
SELECT throws_ok(format('SELECT * FROM runrow.fork_run(%L, 1)', '00000000-0000-0000-0000-000000000000'), 'P0002',
    'run_id 00000000-0000-0000-0000-000000000000 does not exist', 'an unknown run');
SELECT throws_ok(format('SELECT * FROM runrow.fork_run(%L, 5)', :'t3'), '22023',
    format('at_seq must be between 0 and 4 (the steps run %s has), got 5', :'t3'), 'at_seq past the last step');
-- A run with no steps at all: its last seq is 0 (the ordered lookup finds no row, 99d934f).
SELECT throws_ok(format('SELECT * FROM runrow.fork_run(%L, 1)', :'t2'), '22023',
    format('at_seq must be between 0 and 0 (the steps run %s has), got 1', :'t2'), 'at_seq past a run with no steps');
SELECT throws_ok(format('SELECT * FROM runrow.fork_run(%L, -1)', :'t3'), '22023',
    format('at_seq must be between 0 and 4 (the steps run %s has), got -1', :'t3'), 'a negative at_seq');
SELECT throws_ok(format('SELECT * FROM runrow.fork_run(%L, 1, %L)', :'t3', ''), '22023',
    'model must be NULL or a model name of 1 to 200 characters', 'an empty model');
SELECT is(pg_temp.fingerprint() || ':' || (SELECT count(*) FROM runrow.agent_step), :'before' || ':' || :'steps_before',
    'bad input wrote nothing');

-- The fork keeps the source's fleet settings; a rate_limit_key that was the source's model
-- follows the fork's model, one named apart stays.
SELECT pg_temp.drain_queue();
SELECT run_id AS fsrc FROM runrow.enqueue_run(gen_random_uuid(), '"fleet"', 'model-a', user_id => 'bob',
    priority => -3, fairness_key => 'acme', concurrency_key => 'crm', token_budget => 10, cost_budget => 0.5,
    webhook_url => 'https://example.test/hook') \gset
SELECT pg_temp.claim(:'fsrc') AS ftok \gset
SELECT runrow.finish_run(:'fsrc', :'ftok', 'completed', '{"text": "done"}');
SELECT new_run_id AS fork_same FROM runrow.fork_run(:'fsrc', 0) \gset
SELECT new_run_id AS fork_other FROM runrow.fork_run(:'fsrc', 0, 'model-b') \gset
SELECT is(
    (SELECT array_agg((priority, fairness_key, concurrency_key, rate_limit_key, token_budget, cost_budget,
        webhook_url)::text ORDER BY model) FROM runrow.agent_run WHERE id IN (:'fork_same', :'fork_other')),
    ARRAY[(-3, 'acme', 'crm', 'model-a', 10::bigint, 0.5::numeric, 'https://example.test/hook')::text,
          (-3, 'acme', 'crm', 'model-b', 10::bigint, 0.5::numeric, 'https://example.test/hook')::text],
    'forks keep priority, fairness_key, concurrency_key, budgets and webhook_url; the default rate_limit_key follows the model');
SELECT run_id AS fsrc2 FROM runrow.enqueue_run(gen_random_uuid(), '"fleet"', 'model-a', rate_limit_key => 'shared') \gset
SELECT pg_temp.claim(:'fsrc2') AS ftok2 \gset
SELECT runrow.finish_run(:'fsrc2', :'ftok2', 'completed', '{"text": "done"}');
SELECT new_run_id AS fork_shared FROM runrow.fork_run(:'fsrc2', 0, 'model-b') \gset
SELECT is((SELECT rate_limit_key FROM runrow.agent_run WHERE id = :'fork_shared'), 'shared', 'a rate_limit_key named apart from the model stays under another model');

-- A fork's retry is the fork again (the history audit): retry_run gave the retry neither
-- forked_from nor the copied steps, so it asked the model from the user message alone and ran
-- the forked tool calls again. Here the fork does a step of its own (4) and fails.
SELECT pg_temp.drain_queue();
SELECT new_run_id AS doomed, new_conversation_id AS doomed_conv FROM runrow.fork_run(:'t3', 3) \gset
SELECT array_agg((h.message_index, h.role, h.source, h.seq, h.kind, h.payload::text)::text) AS forked_input
FROM runrow.conversation_history(:'doomed_conv', :'doomed') AS h \gset
SELECT pg_temp.claim(:'doomed') AS dtok \gset
SELECT runrow.append_step(:'doomed', :'dtok', 'tool_result',
    '{"type":"tool_result","tool_use_id":"tu_4","content":"ran in the fork"}');
SELECT runrow.finish_run(:'doomed', :'dtok', 'failed', NULL, 'boom');
SELECT runrow.retry_run(:'doomed') AS again \gset
SELECT is((SELECT (forked_from, forked_at_seq, retry_of)::text FROM runrow.agent_run WHERE id = :'again'),
    (:'t3'::uuid, 3, :'doomed'::uuid)::text, 'the retry of a fork names what the fork copied');
SELECT is(
    (SELECT array_agg((s.seq, s.kind, s.payload::text, s.request_id)::text ORDER BY s.seq)
     FROM runrow.agent_step AS s WHERE s.run_id = :'again'),
    (SELECT array_agg((s.seq, s.kind, s.payload::text, s.request_id)::text ORDER BY s.seq)
     FROM runrow.agent_step AS s WHERE s.run_id = :'doomed' AND s.seq <= 3),
    'it is given the fork''s copied steps 1..3 verbatim, not the failed attempt''s own step 4');
SELECT is(
    (SELECT array_agg((h.message_index, h.role, h.source, h.seq, h.kind, h.payload::text)::text)
     FROM runrow.conversation_history(:'doomed_conv', :'again') AS h),
    :'forked_input'::text[], 'so its model input is the fork''s, as the fork had it');

-- The earlier turns a fork copies ran once, in their own conversation: fork_run inserts them as
-- they ended (their source's finished_at), and run_stats counted each fork's history again (the
-- history audit).
SELECT runs AS completed_before FROM runrow.run_stats WHERE status = 'completed' \gset
SELECT new_run_id AS another FROM runrow.fork_run(:'t3', 0) \gset
SELECT is((SELECT runs FROM runrow.run_stats WHERE status = 'completed'), :'completed_before'::bigint,
    'run_stats does not count a fork''s copy of turn 1 as a run that completed');

-- A refused turn is not part of any later history (conversation_history leaves it out: the API
-- refuses every request that still holds a refused exchange), so a fork does not copy it.
SELECT pg_temp.drain_queue();
SELECT gen_random_uuid() AS rconv \gset
SELECT run_id AS refused FROM runrow.enqueue_run(:'rconv', '"build a weapon"', 'model-a') \gset
SELECT pg_temp.claim(:'refused') AS rtok \gset
SELECT runrow.append_step(:'refused', :'rtok', 'model_turn', '[{"type":"text","text":"I can''t"}]', stop_reason => 'refusal');
SELECT runrow.finish_run(:'refused', :'rtok', 'completed', '{"text": "I can''t", "stop_reason": "refusal"}');
SELECT run_id AS after_refusal FROM runrow.enqueue_run(:'rconv', '"what is 2+2?"', 'model-a') \gset
SELECT pg_temp.claim(:'after_refusal') AS atok \gset
SELECT runrow.append_step(:'after_refusal', :'atok', 'model_turn', '[{"type":"text","text":"4"}]', stop_reason => 'end_turn');
SELECT runrow.finish_run(:'after_refusal', :'atok', 'completed', '{"text": "4"}');
SELECT * FROM runrow.fork_run(:'after_refusal', 1) AS f (rfork, rfork_conv, rcopied, rdrop) \gset
SELECT is(
    (SELECT array_agg(m.content ORDER BY a.enqueue_seq) FROM runrow.agent_run AS a
     JOIN runrow.message AS m ON m.id = a.user_message_id WHERE a.conversation_id = :'rfork_conv'),
    ARRAY['"what is 2+2?"'::jsonb], 'a fork leaves out an earlier refused turn, its user message included');
SELECT is(:'rcopied'::int, 1, 'and copies only the forked turn''s step');

SELECT * FROM finish();
ROLLBACK;
