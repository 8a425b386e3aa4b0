-- agent_run has no BEFORE UPDATE row trigger (migration 0030): PostgreSQL locks every row a
-- statement updates ahead of such a trigger, a WAL record per finish, heartbeat, release and
-- reap. So no trigger stamps updated_at any more: every function that changes a run stamps it
-- itself. Each case backdates the run's updated_at (triggers off, as a restore would), calls
-- the function and expects the transaction's now() back.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(15);
SELECT pg_temp.drain_queue();

CREATE FUNCTION pg_temp.backdate(run uuid) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    SET LOCAL session_replication_role = replica;
    UPDATE runrow.agent_run SET updated_at = now() - interval '1 hour' WHERE id = run;
    SET LOCAL session_replication_role = origin;
END $$;

CREATE FUNCTION pg_temp.stamped(run uuid) RETURNS boolean LANGUAGE sql AS $$
    SELECT updated_at = now() FROM runrow.agent_run WHERE id = run
$$;

SELECT is_empty(
    $$SELECT tgname FROM pg_trigger
      WHERE tgrelid = 'runrow.agent_run'::regclass AND NOT tgisinternal
        AND tgtype & 1 = 1 AND tgtype & 2 = 2 AND tgtype & 16 = 16$$,
    'agent_run has no BEFORE UPDATE row trigger'
);

-- The lifecycle.
SELECT pg_temp.new_run() AS r \gset
SELECT pg_temp.backdate(:'r');
SELECT pg_temp.claim(:'r') AS tok \gset
SELECT ok(pg_temp.stamped(:'r'), 'claim_run stamps updated_at');
SELECT pg_temp.backdate(:'r');
SELECT ok((SELECT owned FROM runrow.heartbeat(:'r', :'tok', 30)) AND pg_temp.stamped(:'r'), 'heartbeat stamps it');
SELECT pg_temp.backdate(:'r');
SELECT ok(runrow.finish_run(:'r', :'tok', 'completed') AND pg_temp.stamped(:'r'), 'finish_run stamps it');

SELECT pg_temp.running() AS r \gset
SELECT pg_temp.backdate(:'r');
SELECT ok((SELECT finished FROM runrow.finish_runs(jsonb_build_array(jsonb_build_object(
        'run_id', :'r', 'claim_token', pg_temp.token(:'r'), 'status', 'failed'))))
    AND pg_temp.stamped(:'r'), 'finish_runs stamps it');
SELECT pg_temp.backdate(:'r');
SELECT pg_temp.age_finished(:'r', interval '2 days');
SELECT pg_temp.backdate(:'r');
SELECT cmp_ok(runrow.trim_journal(interval '1 day'), '>', 0::bigint, 'trim_journal trims the run');
SELECT ok(NOT pg_temp.stamped(:'r'), 'and leaves its row alone: nothing writes a finished run (0061)');

SELECT pg_temp.running(attempts => 2) AS r \gset
SELECT pg_temp.backdate(:'r');
SELECT is(runrow.release_run(:'r', pg_temp.token(:'r'), 'transient'), 'requeued', 'release_run requeues');
SELECT ok(pg_temp.stamped(:'r'), 'and stamps it');
SELECT pg_temp.claim(:'r');
SELECT pg_temp.expire(:'r');
SELECT pg_temp.backdate(:'r');
SELECT is((SELECT outcome FROM runrow.reap_expired_runs(30, 100) WHERE run_id = :'r'), 'dead', 'the reaper ends it');
SELECT ok(pg_temp.stamped(:'r'), 'and stamps it');

-- Stops.
SELECT pg_temp.running() AS r \gset
SELECT pg_temp.backdate(:'r');
SELECT runrow.cancel_run(:'r');
SELECT ok(pg_temp.stamped(:'r'), 'a stop of a running run stamps it (cancel_requested)');
SELECT pg_temp.new_run() AS q \gset
SELECT pg_temp.backdate(:'q');
SELECT runrow.cancel_run(:'q');
SELECT ok(pg_temp.stamped(:'q'), 'a stop of a queued run stamps it');

-- The claim's own marks: a turn blocked behind a running one, and a due delayed run.
SELECT gen_random_uuid() AS conv \gset
SELECT pg_temp.running(conv => :'conv') AS first \gset
SELECT pg_temp.new_run(:'conv') AS second \gset
SELECT pg_temp.backdate(:'second');
SELECT is_empty($$SELECT * FROM runrow.claim_runs('pgtap', 10)$$, 'the turn behind a running one is not claimed');
SELECT ok((SELECT claim_blocked FROM runrow.agent_run WHERE id = :'second') AND pg_temp.stamped(:'second'),
    'marking it blocked stamps it');

SELECT * FROM finish();
ROLLBACK;
