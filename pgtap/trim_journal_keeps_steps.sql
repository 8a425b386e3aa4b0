-- runrow.trim_journal drops the live journal of old terminal runs, never their steps,
-- tool effects or messages.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/steps.psql
SELECT plan(5);
SELECT pg_temp.drain_queue();

SELECT pg_temp.running() AS r \gset
SELECT pg_temp.token(:'r') AS tok \gset
SELECT pg_temp.tool_turn(:'r', 'tu_1', 'charge', '{"cents": 5}') AS s1 \gset
SELECT pg_temp.key(:'r', :s1, 'tu_1', 'charge', '{"cents": 5}') AS k1 \gset
SELECT pg_temp.begin(:'r', :'tok', :'k1', 'charge', '{"cents": 5}', 'non_idempotent');
SELECT runrow.complete_tool_call(:'r', :'tok', :'k1', '"ch_1"');
SELECT pg_temp.turn(:'r', '[{"type":"text","text":"charged"}]');
SELECT runrow.finish_run(:'r', :'tok', 'completed');
SELECT pg_temp.age_finished(:'r', '2 days');

CREATE TEMP TABLE steps_before AS SELECT * FROM runrow.agent_step WHERE run_id = :'r';
CREATE TEMP TABLE effects_before AS SELECT * FROM runrow.tool_effect WHERE run_id = :'r';
SELECT is((SELECT count(*)::int FROM steps_before), 3, 'the run has three steps');

SELECT ok(runrow.trim_journal('1 day') > 0, 'the trim deletes journal rows');
SELECT is((SELECT count(*)::int FROM runrow.run_event WHERE run_id = :'r'), 0, 'the run''s journal is gone');
SELECT set_eq(format('SELECT run_id, seq, kind, payload::text, request_id, attempt, created_at FROM runrow.agent_step WHERE run_id = %L', :'r'),
    'SELECT run_id, seq, kind, payload::text, request_id, attempt, created_at FROM steps_before',
    'every step stays, byte for byte');
SELECT set_eq(format('SELECT to_jsonb(e) FROM runrow.tool_effect AS e WHERE run_id = %L', :'r'),
    'SELECT to_jsonb(e) FROM effects_before AS e', 'every tool effect stays, unchanged');

SELECT * FROM finish();
ROLLBACK;
