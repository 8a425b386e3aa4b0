-- runrow.trim_journal: only journals of runs terminal for longer than older_than go; the
-- request snapshot is nulled; runs and messages stay; bad input.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(31);
SELECT pg_temp.drain_queue();

SELECT has_function('runrow', 'trim_journal', ARRAY['interval', 'integer'], 'trim_journal(older_than, max_runs) exists');

SELECT pg_temp.finished('completed') AS old_done \gset
SELECT pg_temp.finished('failed') AS old_failed \gset
SELECT pg_temp.new_run() AS old_stopped \gset
SELECT runrow.cancel_run(:'old_stopped');
SELECT pg_temp.finished('completed') AS young \gset
SELECT pg_temp.finished('completed') AS day_old \gset
SELECT pg_temp.running() AS live \gset
SELECT pg_temp.new_run() AS queued \gset
SELECT pg_temp.age_finished(:'old_done', '2 days'), pg_temp.age_finished(:'old_failed', '25 hours'),
       pg_temp.age_finished(:'old_stopped', '3 days'), pg_temp.age_finished(:'young', '1 hour'),
       pg_temp.age_finished(:'day_old', '23 hours');

CREATE TEMP TABLE runs_before AS SELECT * FROM runrow.agent_run;
CREATE TEMP TABLE messages_before AS SELECT * FROM runrow.message;
SELECT count(*) AS expected FROM runrow.run_event
WHERE run_id IN (:'old_done', :'old_failed', :'old_stopped') \gset
SELECT ok(:expected > 0 AND (SELECT bool_and(EXISTS (SELECT FROM runrow.run_request AS q WHERE q.run_id = a.id))
                            FROM runrow.agent_run AS a),
    'every run has a journal and a request snapshot before the trim');

-- In a database this file has to itself, agent_run holds these few rows and has no statistics,
-- and a scan of the whole table is the cheapest plan for the delete triggers' joins: the file
-- failed run alone and passed only after other files had grown the table. What is proven is
-- that every read of agent_run in a trim has a path by its key, so scans are priced out here.
SET LOCAL enable_seqscan = off;
SELECT pg_stat_get_xact_numscans('runrow.agent_run_finished'::regclass) AS finished_scans,
       pg_stat_get_xact_numscans('runrow.agent_run'::regclass) AS run_seqscans \gset
SELECT is(runrow.trim_journal('1 day'), :expected::bigint,
    'returns the number of journal rows deleted: those of runs terminal for over a day');
RESET enable_seqscan;
-- Its work list is run_request's untrimmed rows, never the history of finished runs: not
-- agent_run_finished, and no scan of agent_run (each run's row by its key).
SELECT is(
    (pg_stat_get_xact_numscans('runrow.agent_run_finished'::regclass) - :finished_scans)
    || ' ' || (pg_stat_get_xact_numscans('runrow.agent_run'::regclass) - :run_seqscans),
    '0 0', 'the trim reads neither agent_run_finished nor the whole of agent_run');
SELECT is((SELECT count(*)::int FROM runrow.run_event WHERE run_id IN (:'old_done', :'old_failed', :'old_stopped')),
    0, 'completed, failed and cancelled runs older than a day lose their journal');
SELECT is((SELECT count(*)::int FROM runrow.run_request WHERE run_id IN (:'old_done', :'old_failed', :'old_stopped')),
    0, 'and their request snapshot');
SELECT is(pg_temp.journal(:'young'), ARRAY['user_message_created', 'run_queued', 'run_claimed', 'complete'],
    'a run terminal for only an hour keeps its journal');
SELECT is(pg_temp.count_events(:'day_old', 'complete'), 1, 'so does one terminal for 23 hours');
SELECT is(pg_temp.journal(:'live'), ARRAY['user_message_created', 'run_queued', 'run_claimed'],
    'a running run keeps its journal');
SELECT is(pg_temp.journal(:'queued'), ARRAY['user_message_created', 'run_queued'], 'a queued run keeps its journal');
SELECT is((SELECT count(*)::int FROM runrow.run_request WHERE run_id IN (:'young', :'live', :'queued')),
    3, 'their request snapshots stay');
SELECT set_eq('SELECT to_jsonb(a) FROM runrow.agent_run AS a', 'SELECT to_jsonb(a) FROM runs_before AS a',
    'every run row stays, unchanged: the trim does not write agent_run');
SELECT set_eq('SELECT to_jsonb(m) FROM runrow.message AS m', 'SELECT to_jsonb(m) FROM messages_before AS m',
    'every message stays, unchanged');
SELECT is((SELECT status FROM runrow.agent_run WHERE id = :'old_failed'), 'failed', 'the trimmed run is still failed');

-- Nothing left to trim: 0, nothing written.
SELECT pg_temp.fingerprint() AS before \gset
SELECT is(runrow.trim_journal('1 day'), 0::bigint, 'a second trim deletes nothing');
SELECT is(pg_temp.fingerprint(), :'before', 'and writes nothing');

-- The threshold is older_than: 0 takes the hour-old run too, the default (24 h) would not.
SELECT is(runrow.trim_journal(), 0::bigint, 'the default keeps runs terminal for less than 24 hours');
SELECT ok(runrow.trim_journal('0 seconds') > 0, 'older_than 0 trims every run that ended before now');
SELECT is((SELECT count(*)::int FROM runrow.run_event WHERE run_id IN (:'young', :'day_old')), 0,
    'including the hour-old and the 23-hour-old run');
SELECT is(pg_temp.journal(:'live'), ARRAY['user_message_created', 'run_queued', 'run_claimed'],
    'never a live run''s journal');

-- A backlog goes in bounded calls, the longest-ended first.
SELECT pg_temp.drain_queue();
SELECT pg_temp.finished('completed') AS oldest \gset
SELECT pg_temp.finished('completed') AS older \gset
SELECT pg_temp.finished('completed') AS newer \gset
SELECT pg_temp.age_finished(:'oldest', '3 days'), pg_temp.age_finished(:'older', '2 days'),
       pg_temp.age_finished(:'newer', '1 day 1 hour');
SET LOCAL track_functions = 'pl';
SELECT coalesce(pg_stat_get_xact_function_calls('runrow._run_event_guard()'::regprocedure), 0) AS row_checks,
       coalesce(pg_stat_get_xact_function_calls('runrow._run_event_delete_guard()'::regprocedure), 0) AS stmt_checks \gset
SELECT ok(runrow.trim_journal('1 day', max_runs => 2) > 0, 'max_runs 2: a bounded trim');
SELECT is(
    (coalesce(pg_stat_get_xact_function_calls('runrow._run_event_guard()'::regprocedure), 0) - :row_checks)
    || ' ' || (pg_stat_get_xact_function_calls('runrow._run_event_delete_guard()'::regprocedure) - :stmt_checks),
    '0 1', 'its delete is checked once for the statement, not once per journal row');
RESET track_functions;
SELECT is(
    (SELECT array_agg(NOT EXISTS (SELECT FROM runrow.run_request AS q WHERE q.run_id = a.id) ORDER BY a.finished_at)
     FROM runrow.agent_run AS a WHERE a.id IN (:'oldest', :'older', :'newer')),
    ARRAY[true, true, false], 'it took the two enqueued (and so ended) longest ago');
SELECT is((SELECT count(*)::int FROM runrow.run_event WHERE run_id = :'newer') > 0, true,
    'the third keeps its journal until the next call');
SELECT ok(runrow.trim_journal('1 day', max_runs => 2) > 0 AND runrow.trim_journal('1 day', max_runs => 2) = 0,
    'the next call takes the rest, and the one after finds nothing');

-- Bad input, with a trimmable run in place: nothing written.
SELECT pg_temp.drain_queue();
SELECT pg_temp.finished('completed') AS trimmable \gset
SELECT pg_temp.age_finished(:'trimmable', '2 days');
SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok('SELECT runrow.trim_journal(''-1 second'')', '22023',
    'older_than must not be negative, got -00:00:01', 'a negative older_than is rejected');
SELECT throws_ok('SELECT runrow.trim_journal(''-1 year 360 days'')', '22023',
    'older_than must not be negative, got -1 years +360 days',
    'an interval that compares as 0 but is 5 days negative is rejected (its cutoff was in the future)');
SELECT throws_ok('SELECT runrow.trim_journal(NULL)', '22004', 'older_than must not be NULL',
    'older_than NULL is rejected');
SELECT throws_ok('SELECT runrow.trim_journal(''1000000 years'')', '22023',
    'older_than is out of range, got 1000000 years', 'an older_than reaching before 4713 BC is rejected, named');
SELECT throws_ok('SELECT runrow.trim_journal(''1 day'', 0)', '22023', 'max_runs must be between 1 and 100000, got 0',
    'max_runs 0 is rejected, named');
SELECT is(pg_temp.fingerprint(), :'before', 'bad input wrote nothing');

SELECT * FROM finish();
ROLLBACK;
