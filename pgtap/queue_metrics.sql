-- runrow.queue_metrics: the one row a metrics scrape reads, right for a known state, and
-- readable by the roles that serve /metrics (worker, client) and the auditor.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/audit.psql
SELECT plan(7);

SELECT pg_temp.drain_queue();

SELECT results_eq($$SELECT queued, running, waiting, waiting_approval, oldest_queued_age_seconds, leases_expired
                    FROM runrow.queue_metrics$$,
    $$VALUES (0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::double precision, 0::bigint)$$,
    'an idle database: every gauge 0 (no NULL age for an empty queue)');

-- One running run with a lapsed lease, one parked on an approval, two queued (the older
-- one queued 90 seconds ago).
SELECT pg_temp.running() AS lapsed \gset
SELECT pg_temp.expire(:'lapsed', 60);
SELECT pg_temp.parked() AS parked \gset
SELECT pg_temp.new_run() AS q1 \gset
SELECT pg_temp.new_run() AS q2 \gset
SELECT pg_temp.bypass(format($$UPDATE runrow.agent_run SET updated_at = now() - interval '90 seconds'
                               WHERE id = %L$$, :'q1'));

SELECT results_eq($$SELECT queued, running, waiting, waiting_approval, leases_expired FROM runrow.queue_metrics$$,
    $$VALUES (2::bigint, 1::bigint, 1::bigint, 1::bigint, 1::bigint)$$,
    'queue depth by status, runs waiting on approval, lapsed leases');
SELECT is((SELECT round(oldest_queued_age_seconds) FROM runrow.queue_metrics), 90::double precision,
    'oldest_queued_age_seconds: the longest-queued run, in seconds');
SELECT is((SELECT count(*) FROM runrow.queue_metrics), 1::bigint, 'always exactly one row');

SELECT lives_ok($$SELECT pg_temp.as_role('runrow_worker', 'SELECT * FROM runrow.queue_metrics')$$,
    'runrow_worker reads it (runrow worker --metrics-port)');
SELECT lives_ok($$SELECT pg_temp.as_role('runrow_client', 'SELECT * FROM runrow.queue_metrics')$$,
    'runrow_client reads it (runrow serve /metrics)');
SELECT lives_ok($$SELECT pg_temp.as_role('runrow_auditor', 'SELECT * FROM runrow.queue_metrics')$$,
    'runrow_auditor reads it');

SELECT * FROM finish();
ROLLBACK;
