-- runrow.watch_runs: a tail's registration that makes a run's journal writes notify. States
-- by the run's status (the lock-busy state needs a second session: tests/test_watched_tails.py),
-- refresh extends, a lapsed confirmation counts for nothing, endings drop the watch, stale
-- watches are pruned, bad input names the argument and registers nothing.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(31);
SELECT pg_temp.drain_queue();

\set sig '''{uuid[],integer}'''
SELECT has_function('runrow', 'watch_runs', :sig::name[], 'watch_runs(run_ids, seconds) exists');
SELECT is_definer('runrow', 'watch_runs', :sig::name[], 'watch_runs is SECURITY DEFINER');
SELECT function_privs_are('runrow', 'watch_runs', :sig::name[], 'runrow_client', ARRAY['EXECUTE'],
    'runrow_client may watch (runrow serve''s hub)');
SELECT function_privs_are('runrow', 'watch_runs', :sig::name[], 'runrow_worker', ARRAY['EXECUTE'],
    'runrow_worker may watch (runrow tail on a worker URL)');
SELECT function_privs_are('runrow', 'watch_runs', :sig::name[], 'public', ARRAY[]::name[], 'PUBLIC may not');
SELECT isnt(obj_description('runrow.watch_runs(uuid[],integer)'::regprocedure, 'pg_proc'), NULL,
    'watch_runs has a COMMENT stating its contract');

-- One call, every status: unknown, ended, queued (registered unconfirmed), running (confirmed:
-- we hold no conflicting lock of our own that FOR SHARE NOWAIT would trip over).
SELECT pg_temp.finished() AS done \gset
SELECT pg_temp.running() AS live \gset
SELECT pg_temp.new_run() AS waiting_turn \gset
SELECT gen_random_uuid() AS nobody \gset
SELECT set_eq(
    format($$SELECT run_id, state FROM runrow.watch_runs(ARRAY[%L, %L, %L, %L, %L]::uuid[], 30)$$,
        :'done', :'live', :'waiting_turn', :'nobody', :'live'),
    format($$VALUES (%L::uuid, 'ended'), (%L::uuid, 'watching'), (%L::uuid, 'queued'), (%L::uuid, 'unknown')$$,
        :'done', :'live', :'waiting_turn', :'nobody'),
    'one row per distinct run: ended, watching (running), queued, unknown'
);
SELECT set_eq(
    'SELECT run_id, confirmed FROM runrow.run_watch',
    format($$VALUES (%L::uuid, true), (%L::uuid, false)$$, :'live', :'waiting_turn'),
    'the running run is watched confirmed, the queued one unconfirmed; the ended and unknown not at all'
);
SELECT ok((SELECT expires_at BETWEEN now() + interval '29 s' AND now() + interval '31 s'
           FROM runrow.run_watch WHERE run_id = :'live'), 'the watch lasts the given seconds');

-- Refresh: extends, never shortens.
SELECT is((SELECT state FROM runrow.watch_runs(ARRAY[:'live']::uuid[], 600)), 'watching', 'a refresh is watching');
SELECT ok((SELECT expires_at > now() + interval '590 s' FROM runrow.run_watch WHERE run_id = :'live'),
    'a refresh extends the watch');
SELECT is((SELECT state FROM runrow.watch_runs(ARRAY[:'live']::uuid[], 5)), 'watching', 'a shorter refresh');
SELECT ok((SELECT expires_at > now() + interval '590 s' FROM runrow.run_watch WHERE run_id = :'live'),
    'does not shorten it');

-- A confirmation that lapsed counts for nothing: writers stopped seeing the watch.
UPDATE runrow.run_watch SET confirmed = true, expires_at = now() - interval '1 s' WHERE run_id = :'waiting_turn';
SELECT is((SELECT state FROM runrow.watch_runs(ARRAY[:'waiting_turn']::uuid[])), 'queued', 'still queued');
SELECT is((SELECT confirmed FROM runrow.run_watch WHERE run_id = :'waiting_turn'), false,
    'a re-registration of a queued run after a lapse is unconfirmed');
-- Once running, a registration under its lock confirms it.
SELECT pg_temp.claim(:'waiting_turn') AS wt_token \gset
SELECT is((SELECT state FROM runrow.watch_runs(ARRAY[:'waiting_turn']::uuid[])), 'watching', 'running now: watching');
SELECT is((SELECT confirmed FROM runrow.run_watch WHERE run_id = :'waiting_turn'), true, 'and confirmed');

-- Endings drop the run's watch: finish_run, and finish_runs.
SELECT ok(runrow.finish_run(:'live', pg_temp.token(:'live'), 'completed'), 'finish_run of a watched run');
SELECT is((SELECT count(*)::int FROM runrow.run_watch WHERE run_id = :'live'), 0, 'finish_run dropped its watch');
SELECT is((SELECT finished FROM runrow.finish_runs(jsonb_build_array(jsonb_build_object(
        'run_id', :'waiting_turn', 'claim_token', :'wt_token', 'status', 'completed')))), true,
    'finish_runs of a watched run');
SELECT is((SELECT count(*)::int FROM runrow.run_watch WHERE run_id = :'waiting_turn'), 0, 'finish_runs dropped its watch');

-- Stale watches (their tail went away, the run never ended) are pruned by later calls.
INSERT INTO runrow.run_watch (run_id, expires_at, confirmed)
SELECT gen_random_uuid(), now() - interval '1 minute', true FROM generate_series(1, 3);
SELECT is((SELECT count(*)::int FROM runrow.watch_runs('{}'::uuid[])), 0, 'an empty call returns nothing');
SELECT is((SELECT count(*)::int FROM runrow.run_watch WHERE expires_at <= now()), 0, 'and pruned the stale watches');

-- Bad input: named, and nothing registered.
SELECT pg_temp.running() AS other \gset
SELECT throws_ok('SELECT * FROM runrow.watch_runs(NULL)', '22004', 'run_ids must not be NULL', 'run_ids NULL');
SELECT throws_ok(format($$SELECT * FROM runrow.watch_runs(ARRAY[%L, NULL]::uuid[])$$, :'other'), '22004',
    'run_ids must not contain NULL', 'a NULL run id');
SELECT throws_ok(format($$SELECT * FROM runrow.watch_runs(array_fill(%L::uuid, ARRAY[1001]))$$, :'other'), '22023',
    'run_ids is too large: at most 1000 runs per call, got 1001', 'over 1000 run ids');
-- A two-dimensional array: array_position raised 0A000 on it, naming nothing (the SQL audit).
SELECT throws_ok(format($$SELECT * FROM runrow.watch_runs(ARRAY[[%L], [%L]]::uuid[])$$, :'other', :'other'), '22023',
    'run_ids must be a one-dimensional array, got 2 dimensions', 'a two-dimensional array of run ids');
SELECT throws_ok(format($$SELECT * FROM runrow.watch_runs(ARRAY[[[%L]]]::uuid[])$$, :'other'), '22023',
    'run_ids must be a one-dimensional array, got 3 dimensions', 'a three-dimensional one');
SELECT throws_ok(format($$SELECT * FROM runrow.watch_runs(ARRAY[%L]::uuid[], 0)$$, :'other'), '22023',
    'seconds must be between 1 and 3600, got 0', 'seconds 0');
SELECT throws_ok(format($$SELECT * FROM runrow.watch_runs(ARRAY[%L]::uuid[], NULL)$$, :'other'), '22004',
    'seconds must not be NULL', 'seconds NULL');
SELECT is((SELECT count(*)::int FROM runrow.run_watch WHERE run_id = :'other'), 0, 'bad input registered nothing');

SELECT * FROM finish();
ROLLBACK;
