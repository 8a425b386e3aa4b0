-- The trigger functions that fire on every lifecycle write carry no SET clause (migration
-- 0041: a SET is a settings save and restore on every row), but for the journal guard's (its
-- lookup by run_event's key whatever the statistics say, migration 0062,
-- pgtap/journal_lookups_by_index.sql; never JIT-compiled, 0063,
-- tests/test_journal_lookups_never_jit.py), and still hold their rules under any search_path: every
-- runrow name in them is qualified. Proven by writing the tables directly under an empty
-- search_path, where an unqualified runrow name would not resolve.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(19);
SELECT pg_temp.drain_queue();

SELECT is(p.proconfig, f.config, format('%s carries %s', p.oid::regprocedure,
        coalesce('only ' || f.config::text, 'no SET clause')))
FROM (VALUES
    ('runrow._run_event_guard()'::regprocedure, '{enable_seqscan=off,jit=off}'::text[]),
    ('runrow._agent_run_after_update()', NULL), ('runrow._agent_run_settings()', NULL),
    ('runrow._run_owner_guard()', NULL), ('runrow._agent_step_guard()', NULL), ('runrow._tool_effect_guard()', NULL)
) AS f (oid, config)
JOIN pg_proc AS p ON p.oid = f.oid
ORDER BY f.oid::text;
SELECT is(count(*), 0::bigint, 'none of them is SECURITY DEFINER (each runs as the writer of the row)')
FROM pg_proc AS p
WHERE p.oid = ANY (ARRAY[
    'runrow._run_event_guard()', 'runrow._agent_run_after_update()', 'runrow._agent_run_settings()',
    'runrow._run_owner_guard()', 'runrow._agent_step_guard()', 'runrow._tool_effect_guard()'
]::regprocedure[]) AND p.prosecdef;

\set QUIET 1
-- Runs sql with search_path = '' (pg_catalog only, searched implicitly).
CREATE FUNCTION pg_temp.bare(sql text) RETURNS void LANGUAGE plpgsql SET search_path = '' AS $$
BEGIN
    EXECUTE sql;
END $$;

-- The journal's seq trigger: numbers a row, refuses a gap, refuses a row after the complete.
SELECT pg_temp.running() AS r \gset
SELECT max(seq) AS r_last FROM runrow.run_event WHERE run_id = :'r' \gset
SELECT lives_ok(format($$SELECT pg_temp.bare(%L)$$, format(
        $$INSERT INTO runrow.run_event (run_id, type, payload) VALUES (%L, 'note', '{"type": "note"}')$$, :'r')),
    'a journal row written directly under an empty search_path');
SELECT is((SELECT array_agg(seq) FROM runrow.run_event WHERE run_id = :'r' AND type = 'note'),
    ARRAY[:r_last + 1]::bigint[], 'it was given the run''s next seq');
SELECT throws_ok(format($$SELECT pg_temp.bare(%L)$$, format(
        $$INSERT INTO runrow.run_event (run_id, seq, type, payload) VALUES (%L, 99, 'note', '{"type": "note"}')$$, :'r')),
    '23000', NULL, 'a seq that leaves a gap is refused under an empty search_path');
SELECT throws_ok(format($$SELECT pg_temp.bare(%L)$$, format(
        $$INSERT INTO runrow.run_event (run_id, type, payload) VALUES (%L, 'note', '{"type": "note"}')$$,
        '00000000-0000-7000-8000-000000000000')),
    '23503', NULL, 'a journal row of a run that does not exist is refused under an empty search_path');
SELECT pg_temp.finished() AS done \gset
SELECT throws_ok(format($$SELECT pg_temp.bare(%L)$$, format(
        $$INSERT INTO runrow.run_event (run_id, type, payload) VALUES (%L, 'note', '{"type": "note"}')$$, :'done')),
    '23505', NULL, 'a row after the complete is refused under an empty search_path');

-- agent_run's statement trigger: turn order on a start, the next turn's wake on an ending.
SELECT gen_random_uuid() AS conv \gset
SELECT pg_temp.new_run(:'conv') AS first \gset
SELECT pg_temp.new_run(:'conv') AS second \gset
SELECT throws_ok(format($$SELECT pg_temp.bare(%L)$$, format(
        $$UPDATE runrow.agent_run SET status = 'running', attempt = 1, worker_id = 'w',
              claim_token = gen_random_uuid(), claim_expires_at = now() + interval '1 minute'
          WHERE id = %L$$, :'second')),
    '40001', NULL, 'starting a turn ahead of its conversation''s earlier one is refused under an empty search_path');
SELECT pg_temp.claim(:'first') AS first_token \gset
SELECT lives_ok(format($$SELECT pg_temp.bare(%L)$$, format(
        $$UPDATE runrow.agent_run SET status = 'completed', finished_at = now(), claim_token = NULL,
              claim_expires_at = NULL, updated_at = now()
          WHERE id = %L$$, :'first')),
    'an ending written directly under an empty search_path runs the trigger''s search for the next turn');
SELECT is(pg_temp.status(:'first'), 'completed', 'the first turn ended');

-- agent_run's insert triggers: the owner of the conversation, the settings' rules.
SELECT throws_ok(format($$SELECT pg_temp.bare(%L)$$, format(
        $$INSERT INTO runrow.agent_run (conversation_id, user_id, user_message_id, model, prompt_id)
          SELECT conversation_id, 'someone-else', user_message_id, model, prompt_id
          FROM runrow.agent_run WHERE id = %L$$, :'second')),
    '42501', NULL, 'a run in someone else''s conversation is refused under an empty search_path');
SELECT throws_ok(format($$SELECT pg_temp.bare(%L)$$, format(
        $$INSERT INTO runrow.agent_run (conversation_id, user_id, user_message_id, model, prompt_id, max_attempts)
          SELECT conversation_id, user_id, user_message_id, model, prompt_id, 0
          FROM runrow.agent_run WHERE id = %L$$, :'second')),
    '23514', NULL, 'a run breaking a settings rule is refused under an empty search_path');

-- The step log's seq trigger.
-- The second turn is the queue's only run now.
SELECT :'second'::uuid AS s, pg_temp.claim(:'second') AS second_token \gset
SELECT throws_ok(format($$SELECT pg_temp.bare(%L)$$, format(
        $$INSERT INTO runrow.agent_step (run_id, seq, kind, payload, attempt)
          VALUES (%L, 2, 'model_turn', '{}', 1)$$, :'s')),
    '23000', NULL, 'a step that leaves a gap is refused under an empty search_path');
SELECT lives_ok(format($$SELECT pg_temp.bare(%L)$$, format(
        $$INSERT INTO runrow.agent_step (run_id, seq, kind, payload, attempt)
          VALUES (%L, 1, 'model_turn', '{}', 1)$$, :'s')),
    'the next step is taken under an empty search_path');

SELECT * FROM finish();
ROLLBACK;
