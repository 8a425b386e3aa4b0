-- runrow.get_run: a client's view of one run.
BEGIN;
\ir helpers/setup.psql
SELECT plan(7);

SELECT pg_temp.new_run(attempts => 3) AS run \gset
SELECT is((SELECT status FROM runrow.get_run(:'run')), 'queued', 'a new run is queued');
SELECT is((SELECT (attempt, max_attempts)::text FROM runrow.get_run(:'run')), '(0,3)', 'attempts are reported');
SELECT pg_temp.drain_queue();
SELECT pg_temp.new_run() AS run2 \gset
SELECT pg_temp.claim(:'run2') AS tok \gset
SELECT runrow.finish_run(:'run2', :'tok', 'completed', '{"text": "done"}');
SELECT is((SELECT (status, result)::text FROM runrow.get_run(:'run2')), '(completed,"{""text"": ""done""}")',
    'status and result of a finished run');
SELECT ok((SELECT finished_at IS NOT NULL FROM runrow.get_run(:'run2')), 'finished_at is set');
SELECT throws_ok($$SELECT * FROM runrow.get_run(NULL)$$, '22004', 'run_id must not be NULL', 'NULL run_id');
SELECT throws_ok($$SELECT * FROM runrow.get_run('00000000-0000-0000-0000-0000000000ff')$$, 'P0002',
    'run_id 00000000-0000-0000-0000-0000000000ff does not exist', 'unknown run_id');
SELECT ok(NOT EXISTS (
    SELECT 1 FROM pg_proc p, LATERAL unnest(p.proargnames) AS n
    WHERE p.proname = 'get_run' AND p.pronamespace = 'runrow'::regnamespace AND n = 'claim_token'),
    'get_run returns no claim_token column');

SELECT * FROM finish();
ROLLBACK;
