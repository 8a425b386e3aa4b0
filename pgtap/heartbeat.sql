-- runrow.heartbeat: extends the lease on the database clock while the token matches,
-- never rotates the token, tells a zombie owned = false, doubles as the cancel poll.
BEGIN;
\ir helpers/setup.psql
\ir helpers/row_versions.psql
SELECT plan(41);
SELECT pg_temp.drain_queue();

\set sig '''{uuid,uuid,integer}'''
SELECT has_function('runrow', 'heartbeat', :sig::name[], 'heartbeat(run_id, claim_token, lease_seconds) exists');
SELECT is_definer('runrow', 'heartbeat', :sig::name[], 'heartbeat is SECURITY DEFINER');
SELECT function_privs_are('runrow', 'heartbeat', :sig::name[], 'runrow_worker', ARRAY['EXECUTE'],
    'runrow_worker may heartbeat');
SELECT function_privs_are('runrow', 'heartbeat', :sig::name[], 'runrow_client', ARRAY[]::name[],
    'runrow_client may not heartbeat');
SELECT function_privs_are('runrow', 'heartbeat', :sig::name[], 'public', ARRAY[]::name[],
    'PUBLIC may not heartbeat');

-- Happy path. now() is constant in this transaction, so "now() + lease" is exact.
SELECT pg_temp.new_run() AS r1 \gset
SELECT pg_temp.claim(:'r1', 10) AS tok \gset
CREATE TEMP TABLE before_hb AS SELECT * FROM runrow.agent_run WHERE id = :'r1';
SELECT count(*) AS events_before FROM runrow.run_event WHERE run_id = :'r1' \gset
SET LOCAL ROLE runrow_worker;
CREATE TEMP TABLE hb1 AS SELECT * FROM runrow.heartbeat(run_id => :'r1', claim_token => :'tok', lease_seconds => 25);
RESET ROLE;
SELECT is((SELECT (owned, cancel_requested)::text FROM hb1), '(t,f)', 'the owner is told owned, no cancel');
SELECT is((SELECT a.claim_expires_at FROM runrow.agent_run AS a WHERE a.id = :'r1'), now() + interval '25 seconds',
    'the lease becomes now() + lease_seconds on the database clock');
SELECT is((SELECT a.last_heartbeat_at FROM runrow.agent_run AS a WHERE a.id = :'r1'), now(),
    'last_heartbeat_at is the database clock');
SELECT is((SELECT a.claim_token FROM runrow.agent_run AS a WHERE a.id = :'r1'), :'tok'::uuid, 'the token does not rotate');
SELECT is(
    (SELECT to_jsonb(a) - 'claim_expires_at' - 'last_heartbeat_at' - 'updated_at' FROM runrow.agent_run AS a
     WHERE a.id = :'r1'),
    (SELECT to_jsonb(b) - 'claim_expires_at' - 'last_heartbeat_at' - 'updated_at' FROM before_hb AS b),
    'nothing else on the run changes (status, worker, attempt, token)');
SELECT is((SELECT count(*) FROM runrow.run_event WHERE run_id = :'r1'), :'events_before'::bigint,
    'a heartbeat journals nothing');
SELECT is((SELECT (owned, cancel_requested)::text FROM runrow.heartbeat(:'r1', :'tok', 1)), '(t,f)',
    'a later heartbeat with a shorter lease is accepted');
SELECT is((SELECT a.claim_expires_at FROM runrow.agent_run AS a WHERE a.id = :'r1'), now() + interval '1 second',
    'the lease is set to now() + lease_seconds, not max()ed with the old one');
SELECT is((SELECT (owned)::text FROM runrow.heartbeat(:'r1', :'tok')), 'true', 'the default lease is accepted');
SELECT is((SELECT a.claim_expires_at FROM runrow.agent_run AS a WHERE a.id = :'r1'), now() + interval '30 seconds',
    'the default lease is 30 s');

-- A lease that lapsed but was not reaped yet: the worker is alive after all, and its
-- heartbeat wins; the reaper's re-check then finds a live lease and reaps nothing.
SELECT pg_temp.expire(:'r1', 120);
SELECT is((SELECT owned FROM runrow.heartbeat(:'r1', :'tok', 30)), true,
    'a heartbeat after the lease lapsed but before a reap still owns the run');
SELECT is((SELECT a.claim_expires_at FROM runrow.agent_run AS a WHERE a.id = :'r1'), now() + interval '30 seconds',
    'and moves the lease back into the future');
SELECT is_empty('SELECT * FROM runrow.reap_expired_runs(0)', 'so the reaper leaves the run alone');

-- Fenced out: a wrong token, an unknown run. owned = false, nothing written.
SELECT pg_temp.written() AS before \gset
SELECT is((SELECT (owned, cancel_requested)::text FROM runrow.heartbeat(:'r1', gen_random_uuid(), 60)), '(f,f)',
    'a wrong token is told owned = false');
SELECT is((SELECT (owned, cancel_requested)::text FROM runrow.heartbeat(gen_random_uuid(), :'tok', 60)), '(f,f)',
    'an unknown run is owned = false');
SELECT is(pg_temp.written(), :'before', 'neither wrote anything');

-- The cancel poll: stop_conversation on a running run is reported to its heartbeat.
SELECT a.conversation_id AS conv FROM runrow.agent_run AS a WHERE a.id = :'r1' \gset
SELECT is((SELECT action FROM runrow.stop_conversation(:'conv')), 'cancel_requested', 'a stop asks the worker to cancel');
SELECT is((SELECT (owned, cancel_requested)::text FROM runrow.heartbeat(:'r1', :'tok', 5)), '(t,t)',
    'the next heartbeat reports cancel_requested and the run is still owned');
SELECT is((SELECT a.claim_expires_at FROM runrow.agent_run AS a WHERE a.id = :'r1'), now() + interval '5 seconds',
    'and still extends the lease, so the worker can finalize cancelled');

-- Fenced out: a finished run.
SELECT ok(runrow.finish_run(:'r1', :'tok', 'cancelled'), 'the worker finalizes cancelled');
SELECT pg_temp.written() AS before \gset
SELECT is((SELECT owned FROM runrow.heartbeat(:'r1', :'tok', 60)), false, 'a heartbeat after finish is owned = false');
SELECT is(pg_temp.written(), :'before', 'and writes nothing');

-- Fenced out: a reaped run (requeued with attempts left, then claimed by someone else).
SELECT pg_temp.new_run(attempts => 2) AS r2 \gset
SELECT pg_temp.claim(:'r2', 2) AS tok2 \gset
SELECT pg_temp.expire(:'r2');
SELECT is((SELECT outcome FROM runrow.reap_expired_runs(0) WHERE run_id = :'r2'), 'requeued', 'the expired run is reaped');
SELECT pg_temp.written() AS before \gset
SELECT is((SELECT (owned, cancel_requested)::text FROM runrow.heartbeat(:'r2', :'tok2', 60)), '(f,f)',
    'the zombie''s heartbeat after the reap is owned = false');
SELECT is(pg_temp.written(), :'before', 'and writes nothing: the run stays queued without a claim');
SELECT pg_temp.claim(:'r2', 2) AS tok3 \gset
SELECT is((SELECT owned FROM runrow.heartbeat(:'r2', :'tok2', 60)), false,
    'after a new claim the zombie''s old token is still owned = false');
SELECT is((SELECT owned FROM runrow.heartbeat(:'r2', :'tok3', 60)), true, 'the new token is owned');

-- Fenced out: a reaped run with no attempts left (failed).
SELECT pg_temp.new_run() AS r3 \gset
SELECT pg_temp.claim(:'r3') AS tok4 \gset
SELECT pg_temp.expire(:'r3');
SELECT is((SELECT outcome FROM runrow.reap_expired_runs(0) WHERE run_id = :'r3'), 'failed', 'a one-attempt run is reaped failed');
SELECT pg_temp.written() AS before \gset
SELECT is((SELECT owned FROM runrow.heartbeat(:'r3', :'tok4', 60)), false, 'its heartbeat is owned = false');
SELECT is(pg_temp.written(), :'before', 'and writes nothing');

-- Bad input: each argument, nothing written.
SELECT pg_temp.written() AS before \gset
SELECT throws_ok(format('SELECT * FROM runrow.heartbeat(NULL, %L)', :'tok3'), '22004',
    'run_id must not be NULL', 'run_id NULL');
SELECT throws_ok(format('SELECT * FROM runrow.heartbeat(%L, NULL)', :'r2'), '22004',
    'claim_token must not be NULL', 'claim_token NULL');
SELECT throws_ok(format('SELECT * FROM runrow.heartbeat(%L, %L, 0)', :'r2', :'tok3'), '22023',
    'lease_seconds must be between 1 and 3600, got 0', 'lease_seconds 0');
SELECT throws_ok(format('SELECT * FROM runrow.heartbeat(%L, %L, 3601)', :'r2', :'tok3'), '22023',
    'lease_seconds must be between 1 and 3600, got 3601', 'lease_seconds 3601');
SELECT throws_ok(format('SELECT * FROM runrow.heartbeat(%L, %L, NULL)', :'r2', :'tok3'), '22004',
    'lease_seconds must not be NULL', 'lease_seconds NULL');
SELECT is(pg_temp.written(), :'before', 'bad input wrote nothing, not even the lease');

SELECT * FROM finish();
ROLLBACK;
