-- runrow.get_run_request: the pinned model, prompt and metadata of a run, claim or no claim.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(7);
SELECT pg_temp.drain_queue();

SELECT run_id AS run, status FROM runrow.enqueue_run(gen_random_uuid(), '"hi"', 'model-q',
    system_prompt => 'be terse', tools => '[{"name": "t", "input_schema": {"type": "object"}}]',
    metadata => '{"max_tokens": 7}') \gset
SELECT is((SELECT (status, model, system_prompt, tools, metadata, forked_from, forked_at_seq)::text
           FROM runrow.get_run_request(:'run')),
    ('queued', 'model-q', 'be terse', '[{"name": "t", "input_schema": {"type": "object"}}]'::jsonb,
     '{"max_tokens": 7}'::jsonb, NULL::uuid, NULL::int)::text,
    'a queued run: model, system prompt, tools and metadata as pinned');
SELECT is((SELECT prompt_id FROM runrow.get_run_request(:'run')),
    (SELECT prompt_id FROM runrow.agent_run WHERE id = :'run'), 'the content address of its prompt');

-- Readable after the run ended (replay reads finished runs), and for a fork.
SELECT pg_temp.claim(:'run') AS tok \gset
SELECT runrow.finish_run(:'run', :'tok', 'completed');
SELECT is((SELECT status FROM runrow.get_run_request(:'run')), 'completed', 'readable once the run ended');
SELECT * FROM runrow.fork_run(:'run', 0, 'model-r') \gset
SELECT is((SELECT (model, system_prompt, forked_from, forked_at_seq)::text FROM runrow.get_run_request(:'new_run_id')),
    ('model-r', 'be terse', :'run'::uuid, 0)::text, 'a fork: its own model, the source''s prompt, its origin');

SET LOCAL ROLE runrow_client;
SELECT is((SELECT model FROM runrow.get_run_request(:'run')), 'model-q', 'a client can read it');
RESET ROLE;

SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok('SELECT * FROM runrow.get_run_request(NULL)', '22004', 'run_id must not be NULL', 'NULL run_id');
SELECT throws_ok('SELECT * FROM runrow.get_run_request(''00000000-0000-0000-0000-000000000000'')', 'P0002',
    'run_id 00000000-0000-0000-0000-000000000000 does not exist', 'an unknown run');

SELECT * FROM finish();
ROLLBACK;
