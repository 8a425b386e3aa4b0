-- runrow.retry_run: a new linked run for failed/dead runs only, idempotent, bad input.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(28);
SELECT pg_temp.drain_queue();

SELECT has_function('runrow', 'retry_run', ARRAY['uuid'], 'retry_run(run_id) exists');

-- A failed run with a non-default prompt, attempts and metadata, so "same" means something.
SELECT run_id AS failed FROM runrow.enqueue_run(
    conversation_id => gen_random_uuid(), content => '"retry me"', model => 'model-r',
    system_prompt => 'be brief', tools => '[{"name": "t", "input_schema": {"type": "object"}}]', max_attempts => 1,
    metadata => '{"k": 1}') \gset
SELECT pg_temp.claim(:'failed');
SELECT runrow.finish_run(:'failed', pg_temp.token(:'failed'), 'failed', NULL, 'model error');
SELECT to_jsonb(a) AS failed_row FROM runrow.agent_run AS a WHERE id = :'failed' \gset

SELECT runrow.retry_run(:'failed') AS retry \gset
SELECT isnt(:'retry'::uuid, :'failed'::uuid, 'retry_run returns a new run');
SELECT is((SELECT (status, attempt, retry_of, claim_token, finished_at)::text FROM runrow.agent_run WHERE id = :'retry'),
    ('queued', 0, :'failed'::uuid, NULL::uuid, NULL::timestamptz)::text,
    'the new run is queued, attempt 0, linked by retry_of');
SELECT is(
    (SELECT (conversation_id, user_message_id, model, prompt_id, max_attempts, metadata, user_id)::text
     FROM runrow.agent_run WHERE id = :'retry'),
    (SELECT (conversation_id, user_message_id, model, prompt_id, max_attempts, metadata, user_id)::text
     FROM runrow.agent_run WHERE id = :'failed'),
    'same conversation, user message, model, pinned prompt, max_attempts and metadata');
SELECT is((SELECT snapshot FROM runrow.run_request WHERE run_id = :'retry'),
    '{"content": "retry me", "metadata": {"k": 1}}'::jsonb, 'the request snapshot is the one enqueue_run took');
SELECT is((SELECT count(*)::int FROM runrow.message
           WHERE conversation_id = (SELECT conversation_id FROM runrow.agent_run WHERE id = :'failed')),
    1, 'no new message: the retry reuses the user message');
SELECT is(pg_temp.journal(:'retry'), ARRAY['user_message_created', 'run_queued'], 'the new run''s journal starts fresh');
SELECT is((SELECT payload FROM runrow.run_event WHERE run_id = :'retry' AND seq = 2),
    jsonb_build_object('type', 'run_queued', 'run_id', :'retry'::uuid, 'retry_of', :'failed'::uuid),
    'run_queued names the run it retries');
SELECT is((SELECT to_jsonb(a) FROM runrow.agent_run AS a WHERE id = :'failed'), :'failed_row'::jsonb,
    'the old run stays exactly as it ended');

-- Idempotent: the second call returns the same run and writes nothing.
SELECT pg_temp.fingerprint() AS before \gset
SELECT is(runrow.retry_run(:'failed'), :'retry'::uuid, 'a second retry returns the same new run');
SELECT is(pg_temp.fingerprint(), :'before', 'and writes nothing');

-- The retry runs like any run.
SELECT is((SELECT (run_id, attempt, model, system_prompt)::text FROM runrow.claim_run('w')),
    (:'retry'::uuid, 1, 'model-r', 'be brief')::text, 'the retry is claimable with the pinned model and prompt');
SELECT is(runrow.retry_run(:'failed'), :'retry'::uuid, 'still the same run once the retry is running');

-- dead runs can be retried too.
SELECT pg_temp.drain_queue();
SELECT pg_temp.exhausted(2) AS dead \gset
SELECT runrow.retry_run(:'dead') AS dead_retry \gset
SELECT is((SELECT (status, retry_of, max_attempts)::text FROM runrow.agent_run WHERE id = :'dead_retry'),
    ('queued', :'dead'::uuid, 2)::text, 'a dead run is retried: a new queued run with the same max_attempts');

-- The fleet settings come along: a retry that dropped them escaped its tenant's budget and
-- fair share, its rate limit and concurrency cap, and its webhook.
SELECT pg_temp.drain_queue();
SELECT run_id AS fleet FROM runrow.enqueue_run(gen_random_uuid(), '"fleet"', 'model-f', user_id => 'bob',
    max_attempts => 1, priority => 7, fairness_key => 'acme', concurrency_key => 'crm', rate_limit_key => 'rk',
    token_budget => 10, cost_budget => 0.01, webhook_url => 'https://example.test/hook') \gset
SELECT pg_temp.claim(:'fleet');
SELECT runrow.finish_run(:'fleet', pg_temp.token(:'fleet'), 'failed', NULL, 'model error');
SELECT runrow.retry_run(:'fleet') AS fleet_retry \gset
SELECT is(
    (SELECT (priority, fairness_key, concurrency_key, rate_limit_key, token_budget, cost_budget, webhook_url)::text
     FROM runrow.agent_run WHERE id = :'fleet_retry'),
    (7, 'acme', 'crm', 'rk', 10::bigint, 0.01::numeric, 'https://example.test/hook')::text,
    'the retry keeps priority, fairness_key, concurrency_key, rate_limit_key, budgets and webhook_url');

-- Any other status: 55000, nothing written.
SELECT pg_temp.drain_queue();
SELECT pg_temp.finished('completed') AS completed \gset
SELECT pg_temp.finished('cancelled') AS cancelled \gset
SELECT pg_temp.running() AS running \gset
SELECT pg_temp.running() AS waiting \gset
UPDATE runrow.agent_run SET status = 'waiting', claim_token = NULL, claim_expires_at = NULL WHERE id = :'waiting';
SELECT pg_temp.new_run() AS queued \gset
SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok(format('SELECT runrow.retry_run(%L)', :'completed'), '55000',
    format('run_id %s is completed: only failed or dead runs can be retried', :'completed'),
    'a completed run cannot be retried');
SELECT throws_ok(format('SELECT runrow.retry_run(%L)', :'cancelled'), '55000',
    format('run_id %s is cancelled: only failed or dead runs can be retried', :'cancelled'),
    'a cancelled run cannot be retried');
SELECT throws_ok(format('SELECT runrow.retry_run(%L)', :'running'), '55000',
    format('run_id %s is running: only failed or dead runs can be retried', :'running'),
    'a running run cannot be retried');
SELECT throws_ok(format('SELECT runrow.retry_run(%L)', :'waiting'), '55000',
    format('run_id %s is waiting: only failed or dead runs can be retried', :'waiting'),
    'a waiting run cannot be retried');
SELECT throws_ok(format('SELECT runrow.retry_run(%L)', :'queued'), '55000',
    format('run_id %s is queued: only failed or dead runs can be retried', :'queued'),
    'a queued run cannot be retried');
SELECT is(pg_temp.fingerprint(), :'before', 'refused retries wrote nothing');

-- Unknown run and bad input: nothing written.
SELECT throws_ok('SELECT runrow.retry_run(''00000000-0000-0000-0000-000000000000'')', 'P0002',
    'run_id 00000000-0000-0000-0000-000000000000 does not exist', 'an unknown run_id raises P0002');
SELECT throws_ok('SELECT runrow.retry_run(NULL)', '22004', 'run_id must not be NULL', 'run_id NULL is rejected');
SELECT is(pg_temp.fingerprint(), :'before', 'an unknown run and bad input wrote nothing');

-- A retry that failed again is retried as a new run of its own (a chain, not a reuse).
SELECT pg_temp.drain_queue();
SELECT pg_temp.finished('failed') AS again \gset
SELECT runrow.retry_run(:'again') AS r1 \gset
SELECT pg_temp.claim(:'r1');
SELECT runrow.finish_run(:'r1', pg_temp.token(:'r1'), 'failed');
SELECT runrow.retry_run(:'r1') AS r2 \gset
SELECT is((SELECT retry_of FROM runrow.agent_run WHERE id = :'r2'), :'r1'::uuid, 'a failed retry is retried in turn');
SELECT isnt(:'r2'::uuid, :'r1'::uuid, 'as another new run');

-- A retry of a trimmed run still gets its snapshot (rebuilt from the kept message), so
-- its own journal is trimmed in its turn.
SELECT pg_temp.drain_queue();
SELECT pg_temp.finished('failed') AS trimmed \gset
SELECT pg_temp.age_finished(:'trimmed', '2 days');
SELECT runrow.trim_journal('1 day');
SELECT runrow.retry_run(:'trimmed') AS retry_of_trimmed \gset
SELECT is((SELECT snapshot FROM runrow.run_request WHERE run_id = :'retry_of_trimmed'),
    '{"content": "hello", "metadata": {}}'::jsonb, 'a retry of a trimmed run rebuilds the snapshot from the message');
SELECT pg_temp.claim(:'retry_of_trimmed');
SELECT runrow.finish_run(:'retry_of_trimmed', pg_temp.token(:'retry_of_trimmed'), 'completed');
SELECT pg_temp.age_finished(:'retry_of_trimmed', '2 days');
SELECT is(runrow.trim_journal('1 day'), 4::bigint, 'and its journal is trimmed in its turn');

SELECT * FROM finish();
ROLLBACK;
