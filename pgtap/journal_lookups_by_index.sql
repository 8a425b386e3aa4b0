-- The journal's lookups go by run_event's key whatever the planner's estimates say. Every
-- journal row's guard reads its run's last seq, and read_events reads a run's journal: after a
-- trim empties run_event and a VACUUM records that (a few live rows over many pages), the
-- planner priced that lookup above a scan of the whole table, and every journal insert scanned
-- it until the next ANALYZE (found by bench.trim: its second fill of 200,000 runs stalled for
-- 45 minutes after 2,002). Here the same preference is forced by costing random reads at a
-- million: the calls must still read by index, and not scan run_event once.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(8);
-- Before any journal row is written in this session: each lookup is planned under these costs.
SET LOCAL random_page_cost = 1000000;
SELECT pg_temp.drain_queue();

CREATE FUNCTION pg_temp.seq_scans() RETURNS bigint LANGUAGE sql AS $$
    SELECT pg_stat_get_xact_numscans('runrow.run_event'::regclass)
$$;

SELECT pg_temp.seq_scans() AS before \gset
SELECT pg_temp.new_run() AS run \gset
SELECT is(pg_temp.seq_scans(), :'before'::bigint, 'enqueue_run journals its first events without scanning run_event');

SELECT pg_temp.claim(:'run') AS token \gset
SELECT is(pg_temp.seq_scans(), :'before'::bigint, 'the claim journals run_claimed without scanning run_event');

SELECT ok(runrow.append_events(:'run', :'token', '[{"type": "text_delta", "text": "a"}, {"type": "x"}]') IS NOT NULL,
    'append_events writes');
SELECT is(pg_temp.seq_scans(), :'before'::bigint, 'append_events reads the last seq by index, not by scanning');

SELECT ok(runrow.finish_run(:'run', :'token', 'completed'), 'finish_run writes');
SELECT is(pg_temp.seq_scans(), :'before'::bigint, 'finish_run journals complete without scanning');

SELECT is((SELECT count(*) FROM runrow.read_events(:'run')), 6::bigint, 'read_events reads the whole journal');
SELECT is(pg_temp.seq_scans(), :'before'::bigint, 'by index, not by scanning run_event');

SELECT * FROM finish();
ROLLBACK;
