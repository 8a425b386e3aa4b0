-- runrow.reap_expired_runs: every outcome, the grace, the re-claim with a new token,
-- fencing of the old token, bad input.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(43);
SELECT pg_temp.drain_queue();

SELECT has_function('runrow', 'reap_expired_runs', ARRAY['integer', 'integer'],
    'reap_expired_runs(grace_seconds, max_runs) exists');

-- One run for each outcome, plus runs the reaper must leave alone.
SELECT pg_temp.running(attempts => 3) AS requeue \gset
SELECT pg_temp.token(:'requeue') AS old_token \gset
SELECT pg_temp.running(attempts => 1) AS fail \gset
SELECT pg_temp.new_run(attempts => 2) AS dead \gset
SELECT pg_temp.claim(:'dead');
SELECT runrow.release_run(:'dead', pg_temp.token(:'dead'), 'transient');
SELECT pg_temp.claim(:'dead');
SELECT pg_temp.running(attempts => 3) AS cancel \gset
SELECT runrow.cancel_run(:'cancel');
SELECT pg_temp.running() AS in_grace \gset
SELECT pg_temp.running() AS beating \gset
SELECT pg_temp.running() AS live \gset
SELECT pg_temp.token(:'beating') AS beating_token \gset
SELECT pg_temp.expire(:'requeue'), pg_temp.expire(:'fail'), pg_temp.expire(:'dead'),
       pg_temp.expire(:'cancel'), pg_temp.expire(:'beating');
-- Expired 10 s ago: past the lease, still inside a 30 s grace.
SELECT pg_temp.expire(:'in_grace', 10);
-- A heartbeat lands after the lease lapsed and before the reaper: the run is live again.
SELECT owned FROM runrow.heartbeat(:'beating', :'beating_token', 30);

CREATE TEMP TABLE reaped AS SELECT * FROM runrow.reap_expired_runs(grace_seconds => 30);
SELECT set_eq('SELECT run_id, outcome FROM reaped',
    format('VALUES (%L::uuid, ''requeued''), (%L::uuid, ''failed''), (%L::uuid, ''dead''), (%L::uuid, ''cancelled'')',
        :'requeue', :'fail', :'dead', :'cancel'),
    'exactly the four expired runs are reaped, one row each with its outcome');

-- requeued: attempts left, back in the queue, claim cleared, run_requeued journaled.
SELECT is(
    (SELECT (status, claim_token, claim_expires_at, finished_at, attempt)::text
     FROM runrow.agent_run WHERE id = :'requeue'),
    ('queued', NULL::uuid, NULL::timestamptz, NULL::timestamptz, 1)::text,
    'requeued: status queued, claim cleared, not finished, attempt kept');
SELECT is(pg_temp.last_event(:'requeue') - 'error',
    '{"type": "run_requeued", "attempt": 1, "max_attempts": 3}'::jsonb, 'requeued: run_requeued is journaled');
SELECT is(pg_temp.last_event(:'requeue') ->> 'error',
    'lease expired: no heartbeat for more than the lease + 30 s grace', 'run_requeued says why');
SELECT is(pg_temp.count_events(:'requeue', 'complete'), 0, 'requeued: no complete event');

-- failed: max_attempts = 1, at most once.
SELECT is(
    (SELECT (status, claim_token, finished_at IS NOT NULL, error)::text FROM runrow.agent_run WHERE id = :'fail'),
    ('failed', NULL::uuid, true, 'lease expired: no heartbeat for more than the lease + 30 s grace')::text,
    'failed: max_attempts = 1 ends the run failed, with the reason');
SELECT is(pg_temp.count_events(:'fail', 'complete'), 1, 'failed: exactly one complete');
SELECT is(pg_temp.last_event(:'fail'),
    jsonb_build_object('type', 'complete', 'status', 'failed', 'result', NULL,
        'error', 'lease expired: no heartbeat for more than the lease + 30 s grace'),
    'failed: the complete event carries status and error and is the last event');

-- dead: attempts exhausted.
SELECT is((SELECT (status, attempt, finished_at IS NOT NULL)::text FROM runrow.agent_run WHERE id = :'dead'),
    ('dead', 2, true)::text, 'dead: the last of 2 attempts lapsed');
SELECT is(pg_temp.count_events(:'dead', 'complete'), 1, 'dead: exactly one complete');
SELECT is(pg_temp.last_event(:'dead') ->> 'status', 'dead', 'dead: complete says dead');

-- cancelled: a stop was pending, attempts left do not matter.
SELECT is((SELECT (status, attempt, finished_at IS NOT NULL)::text FROM runrow.agent_run WHERE id = :'cancel'),
    ('cancelled', 1, true)::text, 'cancelled: a pending stop wins over the attempts left');
SELECT is(pg_temp.count_events(:'cancel', 'complete'), 1, 'cancelled: exactly one complete');
SELECT is(pg_temp.last_event(:'cancel') ->> 'status', 'cancelled', 'cancelled: complete says cancelled');

-- Left alone.
SELECT is((SELECT (status, claim_token IS NOT NULL)::text FROM runrow.agent_run WHERE id = :'in_grace'),
    ('running', true)::text, 'a lease expired but within the grace is not reaped');
SELECT is((SELECT (status, claim_token)::text FROM runrow.agent_run WHERE id = :'beating'),
    ('running', :'beating_token'::uuid)::text, 'a run heartbeated after its lease lapsed is not reaped');
SELECT is(pg_temp.status(:'live'), 'running', 'a live lease is not reaped');

-- Fenced out: a second pass finds nothing; what it reaped already ended, writes nothing.
SELECT pg_temp.fingerprint() AS before \gset
SELECT is_empty('SELECT * FROM runrow.reap_expired_runs(30)', 'a second pass reaps nothing');
SELECT is(pg_temp.fingerprint(), :'before', 'the second pass wrote nothing');

-- The grace decides: with grace 5 the run expired 10 s ago goes.
SELECT is((SELECT outcome FROM runrow.reap_expired_runs(grace_seconds => 5)), 'failed',
    'the same run is reaped once it is beyond the grace');

-- The requeued run is claimable again: attempt + 1 and a NEW token.
CREATE TEMP TABLE again AS SELECT * FROM runrow.claim_run('w2');
SELECT is((SELECT run_id FROM again), :'requeue'::uuid, 'the requeued run is claimed again');
SELECT is((SELECT attempt FROM again), 2, 'with attempt + 1');
SELECT isnt((SELECT claim_token FROM again), :'old_token'::uuid, 'with a new token');
SELECT is(pg_temp.last_event(:'requeue') ->> 'type', 'run_claimed', 'the second claim is journaled');

-- The zombie holding the old token is fenced out everywhere, and writes nothing.
SELECT pg_temp.fingerprint() AS before \gset
SELECT is((SELECT owned FROM runrow.heartbeat(:'requeue', :'old_token', 30)), false,
    'old token: heartbeat says owned = false');
SELECT is(runrow.append_events(:'requeue', :'old_token', '[{"type": "text", "text": "zombie"}]'), NULL,
    'old token: append_events returns NULL');
SELECT is(runrow.finish_run(:'requeue', :'old_token', 'completed'), false, 'old token: finish_run returns false');
SELECT is(runrow.release_run(:'requeue', :'old_token'), NULL, 'old token: release_run returns NULL');
SELECT is(pg_temp.fingerprint(), :'before', 'the zombie wrote nothing');
SELECT is((SELECT (status, claim_token)::text FROM runrow.agent_run WHERE id = :'requeue'),
    (SELECT ('running', claim_token)::text FROM again), 'the new owner still holds the run');

-- max_runs: the longest-expired first, at most max_runs per call.
SELECT pg_temp.drain_queue();
SELECT pg_temp.running() AS older \gset
SELECT pg_temp.running() AS newer \gset
SELECT pg_temp.expire(:'older', 7200), pg_temp.expire(:'newer', 3600);
SELECT results_eq('SELECT run_id FROM runrow.reap_expired_runs(max_runs => 1)',
    format('VALUES (%L::uuid)', :'older'), 'max_runs => 1 reaps only the longest-expired run');
SELECT is(pg_temp.status(:'newer'), 'running', 'the other one waits for the next pass');

-- Bad input, with an expired run in place that a reap would take: nothing written.
SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok('SELECT * FROM runrow.reap_expired_runs(NULL, 10)', '22004',
    'grace_seconds must not be NULL', 'grace_seconds NULL is rejected');
SELECT throws_ok('SELECT * FROM runrow.reap_expired_runs(-1, 10)', '22023',
    'grace_seconds must be between 0 and 86400, got -1', 'grace_seconds -1 is rejected');
SELECT throws_ok('SELECT * FROM runrow.reap_expired_runs(86401, 10)', '22023',
    'grace_seconds must be between 0 and 86400, got 86401', 'grace_seconds 86401 is rejected');
SELECT throws_ok('SELECT * FROM runrow.reap_expired_runs(30, NULL)', '22004',
    'max_runs must not be NULL', 'max_runs NULL is rejected');
SELECT throws_ok('SELECT * FROM runrow.reap_expired_runs(30, 0)', '22023',
    'max_runs must be between 1 and 10000, got 0', 'max_runs 0 is rejected');
SELECT throws_ok('SELECT * FROM runrow.reap_expired_runs(30, 10001)', '22023',
    'max_runs must be between 1 and 10000, got 10001', 'max_runs 10001 is rejected');
SELECT is(pg_temp.fingerprint(), :'before', 'bad input wrote nothing');
SELECT is(pg_temp.status(:'newer'), 'running', 'the expired run is still running');

-- Defaults: grace 30 s, so a run expired 3600 s ago goes.
SELECT is((SELECT outcome FROM runrow.reap_expired_runs()), 'failed', 'the defaults reap it');
SELECT is(pg_temp.journal(:'newer'),
    ARRAY['user_message_created', 'run_queued', 'run_claimed', 'complete'],
    'the whole journal of a reaped run: no gap, one complete last');

SELECT * FROM finish();
ROLLBACK;
