-- runrow.cancel_run: cancelled / cancel_requested / already_<status>, unknown run, bad input.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(29);
SELECT pg_temp.drain_queue();

SELECT has_function('runrow', 'cancel_run', ARRAY['uuid'], 'cancel_run(run_id) exists');

-- A running turn with a queued turn behind it in the same conversation.
\set conv '''cccccccc-0000-0000-0000-000000000002'''
SELECT pg_temp.running(conv => :conv) AS running \gset
SELECT pg_temp.token(:'running') AS token \gset
SELECT pg_temp.new_run(:conv) AS queued \gset

-- queued -> cancelled; only that run.
SELECT is(runrow.cancel_run(:'queued'), 'cancelled', 'a queued run: cancelled');
SELECT is((SELECT (status, finished_at IS NOT NULL, error)::text FROM runrow.agent_run WHERE id = :'queued'),
    ('cancelled', true, 'stopped before it finished')::text, 'the queued run is cancelled and finished');
SELECT is((SELECT m.status FROM runrow.message AS m JOIN runrow.agent_run AS a ON a.user_message_id = m.id
           WHERE a.id = :'queued'), 'draft', 'its message is handed back as a draft');
SELECT is(pg_temp.last_event(:'queued') ->> 'type', 'complete', 'complete is journaled');
SELECT is(pg_temp.count_events(:'queued', 'complete'), 1, 'exactly once');
SELECT is((SELECT (status, cancel_requested)::text FROM runrow.agent_run WHERE id = :'running'),
    ('running', false)::text, 'the other turn of the conversation is untouched');

-- running -> cancel_requested; the worker finalizes.
SELECT is(runrow.cancel_run(:'running'), 'cancel_requested', 'a running run: cancel_requested');
SELECT is((SELECT (status, cancel_requested, claim_token)::text FROM runrow.agent_run WHERE id = :'running'),
    ('running', true, :'token'::uuid)::text, 'still running with its claim, flag set');
SELECT is(pg_temp.last_event(:'running'), '{"type": "cancel_requested"}'::jsonb, 'cancel_requested is journaled');
SELECT pg_temp.fingerprint() AS before \gset
SELECT is(runrow.cancel_run(:'running'), 'cancel_requested', 'cancelling it again says cancel_requested again');
SELECT is(pg_temp.fingerprint(), :'before', 'and writes nothing');

-- waiting -> cancelled.
SELECT pg_temp.running() AS waiting \gset
UPDATE runrow.agent_run SET status = 'waiting', claim_token = NULL, claim_expires_at = NULL WHERE id = :'waiting';
SELECT is(runrow.cancel_run(:'waiting'), 'cancelled', 'a waiting run: cancelled');
SELECT is(pg_temp.status(:'waiting'), 'cancelled', 'the waiting run is cancelled');

-- Already ended: left alone, nothing written.
SELECT runrow.finish_run(:'running', :'token', 'cancelled');
SELECT pg_temp.finished('completed') AS completed \gset
SELECT pg_temp.finished('failed') AS failed \gset
SELECT pg_temp.exhausted(2) AS dead \gset
SELECT pg_temp.fingerprint() AS before \gset
SELECT is(runrow.cancel_run(:'completed'), 'already_completed', 'a completed run: already_completed');
SELECT is(runrow.cancel_run(:'failed'), 'already_failed', 'a failed run: already_failed');
SELECT is(runrow.cancel_run(:'dead'), 'already_dead', 'a dead run: already_dead');
SELECT is(runrow.cancel_run(:'queued'), 'already_cancelled', 'a cancelled run: already_cancelled');
SELECT is(runrow.cancel_run(:'running'), 'already_cancelled', 'a run its worker finalized: already_cancelled');
SELECT is(pg_temp.fingerprint(), :'before', 'cancelling ended runs wrote nothing');

-- Unknown run and bad input, with a queued run around: nothing written.
SELECT pg_temp.new_run() AS live \gset
SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok('SELECT runrow.cancel_run(''00000000-0000-0000-0000-000000000000'')', 'P0002',
    'run_id 00000000-0000-0000-0000-000000000000 does not exist', 'an unknown run_id raises P0002');
SELECT throws_ok('SELECT runrow.cancel_run(NULL)', '22004', 'run_id must not be NULL', 'run_id NULL is rejected');
SELECT is(pg_temp.fingerprint(), :'before', 'an unknown run and bad input wrote nothing');
SELECT is(pg_temp.status(:'live'), 'queued', 'the queued run is still queued');

-- Bounded like stop_conversation: a frozen holder makes the cancel fail with 55P03, not hang.
SELECT ok((SELECT proconfig FROM pg_proc WHERE oid = 'runrow.cancel_run(uuid)'::regprocedure)
    @> ARRAY['lock_timeout=5s'], 'cancel_run waits at most lock_timeout = 5s for the run''s lock');

-- runrow._lock_run_by (the stops' row lock, one deadline for every wait it makes): a run locked
-- is true, no such run false, a deadline already passed 55P03 with nothing taken; it leaves
-- lock_timeout to the caller's transaction (the functions' SET clause undoes it).
SELECT ok(runrow._lock_run_by(:'live', clock_timestamp() + interval '5 seconds'), 'a run is locked: true');
SELECT ok(NOT runrow._lock_run_by(gen_random_uuid(), clock_timestamp() + interval '5 seconds'), 'no such run: false');
SELECT throws_ok(format('SELECT runrow._lock_run_by(%L, clock_timestamp() - interval ''1 second'')', :'live'),
    '55P03', format('run %s not locked by its deadline', :'live'), 'a deadline passed: 55P03 naming the run');
SELECT is(runrow.cancel_run(:'live'), 'cancelled', 'cancel_run through it: the queued run is cancelled');

SELECT * FROM finish();
ROLLBACK;
