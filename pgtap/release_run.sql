-- runrow.release_run: every outcome, fencing (wrong token, ended, reaped), bad input.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(41);
SELECT pg_temp.drain_queue();

SELECT has_function('runrow', 'release_run', ARRAY['uuid', 'uuid', 'text', 'interval'],
    'release_run(run_id, claim_token, error, retry_in) exists');

-- requeued: attempts left, back in the queue at once, without waiting for the lease.
SELECT pg_temp.running(attempts => 3) AS requeue \gset
SELECT pg_temp.token(:'requeue') AS old_token \gset
SELECT is(runrow.release_run(:'requeue', :'old_token', 'rate limited'), 'requeued',
    'with attempts left the outcome is requeued');
SELECT is(
    (SELECT (status, claim_token, claim_expires_at, finished_at, attempt, error)::text
     FROM runrow.agent_run WHERE id = :'requeue'),
    ('queued', NULL::uuid, NULL::timestamptz, NULL::timestamptz, 1, 'rate limited')::text,
    'requeued: queued, claim cleared, not finished, the error kept');
SELECT is(pg_temp.last_event(:'requeue'),
    '{"type": "run_requeued", "attempt": 1, "max_attempts": 3, "error": "rate limited"}'::jsonb,
    'requeued: run_requeued journaled with the attempt and the error');
SELECT is(pg_temp.count_events(:'requeue', 'complete'), 0, 'requeued: no complete event');
CREATE TEMP TABLE again AS SELECT * FROM runrow.claim_run('w2', 30);
SELECT is((SELECT (run_id, attempt)::text FROM again), (:'requeue'::uuid, 2)::text,
    'the released run is claimable at once, attempt + 1');
SELECT isnt((SELECT claim_token FROM again), :'old_token'::uuid, 'with a new token');

-- Fenced out: the old token after the re-claim, and a token that never held the run.
SELECT pg_temp.fingerprint() AS before \gset
SELECT is(runrow.release_run(:'requeue', :'old_token'), NULL, 'the old token is fenced out: NULL');
SELECT is(runrow.release_run(:'requeue', gen_random_uuid()), NULL, 'a wrong token is fenced out: NULL');
SELECT is(pg_temp.fingerprint(), :'before', 'fenced-out releases wrote nothing');

-- NULL error is fine: the default.
SELECT is(runrow.release_run(:'requeue', (SELECT claim_token FROM again)), 'requeued',
    'release without an error (attempt 2 of 3) requeues');
SELECT is(pg_temp.last_event(:'requeue') -> 'error', 'null'::jsonb, 'the journaled error is null');

-- failed: max_attempts = 1.
SELECT pg_temp.drain_queue();
SELECT pg_temp.running() AS fail \gset
SELECT is(runrow.release_run(:'fail', pg_temp.token(:'fail'), 'boom'), 'failed', 'max_attempts = 1: failed');
SELECT is((SELECT (status, claim_token, finished_at IS NOT NULL, error)::text FROM runrow.agent_run WHERE id = :'fail'),
    ('failed', NULL::uuid, true, 'boom')::text, 'failed: terminal, claim cleared, error kept');
SELECT is(pg_temp.count_events(:'fail', 'complete'), 1, 'failed: exactly one complete');
SELECT is(pg_temp.last_event(:'fail'),
    '{"type": "complete", "status": "failed", "result": null, "error": "boom"}'::jsonb,
    'failed: complete carries status and error');

-- dead: the last attempt handed back.
SELECT pg_temp.new_run(attempts => 2) AS dead \gset
SELECT pg_temp.claim(:'dead');
SELECT runrow.release_run(:'dead', pg_temp.token(:'dead'));
SELECT pg_temp.claim(:'dead');
SELECT is(runrow.release_run(:'dead', pg_temp.token(:'dead'), 'still failing'), 'dead',
    'attempts exhausted: dead');
SELECT is((SELECT (status, attempt, finished_at IS NOT NULL)::text FROM runrow.agent_run WHERE id = :'dead'),
    ('dead', 2, true)::text, 'dead: terminal after 2 of 2 attempts');
SELECT is(pg_temp.count_events(:'dead', 'complete'), 1, 'dead: exactly one complete');

-- cancelled: a stop was pending, attempts left do not matter.
SELECT pg_temp.running(attempts => 3) AS cancel \gset
SELECT runrow.cancel_run(:'cancel');
SELECT is(runrow.release_run(:'cancel', pg_temp.token(:'cancel')), 'cancelled', 'a pending stop: cancelled');
SELECT is(pg_temp.last_event(:'cancel') ->> 'status', 'cancelled', 'cancelled: complete journaled');

-- Fenced out: the run already ended (finished), or was reaped.
SELECT pg_temp.running(attempts => 3) AS ended \gset
SELECT pg_temp.token(:'ended') AS ended_token \gset
SELECT runrow.finish_run(:'ended', :'ended_token', 'completed');
SELECT pg_temp.running(attempts => 3) AS reaped \gset
SELECT pg_temp.token(:'reaped') AS reaped_token \gset
SELECT pg_temp.expire(:'reaped');
SELECT outcome FROM runrow.reap_expired_runs();
SELECT pg_temp.fingerprint() AS before \gset
SELECT is(runrow.release_run(:'ended', :'ended_token'), NULL, 'a run that already ended: NULL');
SELECT is(runrow.release_run(:'reaped', :'reaped_token'), NULL, 'a run the reaper took: NULL');
SELECT is(runrow.release_run(:'fail', gen_random_uuid()), NULL, 'a terminal run with any token: NULL');
SELECT is(pg_temp.fingerprint(), :'before', 'fenced-out releases wrote nothing');

-- Bad input, with a live run and its real token in the other arguments: nothing written.
SELECT pg_temp.drain_queue();
SELECT pg_temp.running(attempts => 3) AS live \gset
SELECT pg_temp.token(:'live') AS live_token \gset
SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok(format('SELECT runrow.release_run(NULL, %L, ''x'')', :'live_token'), '22004',
    'run_id must not be NULL', 'run_id NULL is rejected');
SELECT throws_ok(format('SELECT runrow.release_run(%L, NULL, ''x'')', :'live'), '22004',
    'claim_token must not be NULL', 'claim_token NULL is rejected');
SELECT throws_ok(format('SELECT runrow.release_run(%L, %L, repeat(''x'', 10001))', :'live', :'live_token'),
    '22023', 'error is too long: at most 10000 characters', 'an error over 10000 characters is rejected');
SELECT throws_ok(format($$SELECT runrow.release_run(%L, %L, 'x', interval '0')$$, :'live', :'live_token'),
    '22023', NULL, 'a zero retry_in is rejected');
SELECT throws_ok(format($$SELECT runrow.release_run(%L, %L, 'x', interval '-1 second')$$, :'live', :'live_token'),
    '22023', NULL, 'a negative retry_in is rejected');
SELECT throws_ok(format($$SELECT runrow.release_run(%L, %L, 'x', interval '2 days')$$, :'live', :'live_token'),
    '22023', 'retry_in must be NULL or more than 0 and at most 1 day, got 2 days',
    'a retry_in over a day is rejected, naming retry_in');
SELECT throws_ok(format($$SELECT runrow.release_run(%L, %L, 'x', interval '-1 year 361 days')$$, :'live', :'live_token'),
    '22023', 'retry_in must be NULL or more than 0 and at most 1 day, got -1 years +361 days',
    'a retry_in that compares as a day but lands in the past is rejected');
SELECT is(pg_temp.fingerprint(), :'before', 'bad input wrote nothing');
SELECT is(pg_temp.status(:'live'), 'running', 'the run is still running');

-- retry_in: the backoff. Requeued, with not_before = now() + retry_in, and journaled.
SELECT is(runrow.release_run(:'live', :'live_token', '429 rate limited', interval '30 seconds'), 'requeued',
    'with retry_in and attempts left the outcome is requeued');
SELECT is(
    (SELECT (status, not_before = now() + interval '30 seconds', claim_token, error)::text
     FROM runrow.agent_run WHERE id = :'live'),
    ('queued', true, NULL::uuid, '429 rate limited')::text,
    'queued, not claimable before now() + retry_in (the database clock), claim cleared');
SELECT is(pg_temp.last_event(:'live'),
    jsonb_build_object('type', 'run_requeued', 'attempt', 1, 'max_attempts', 3, 'error', '429 rate limited',
                       'not_before', now() + interval '30 seconds'),
    'run_requeued carries not_before');
-- A later requeue without a delay (here: the reaper) makes it claimable at once again.
UPDATE runrow.agent_run SET not_before = NULL WHERE id = :'live';
SELECT pg_temp.claim(:'live') AS live_token2 \gset
SELECT pg_temp.expire(:'live');
SELECT is((SELECT outcome FROM runrow.reap_expired_runs(grace_seconds => 0) WHERE run_id = :'live'), 'requeued',
    'the reaper requeues it');
SELECT is((SELECT not_before FROM runrow.agent_run WHERE id = :'live'), NULL,
    'a reap requeues without a delay: the crash says nothing about the model');
-- retry_in on a run with no attempts left: failed, and no not_before is left on the ended run.
SELECT pg_temp.drain_queue();
SELECT pg_temp.running() AS once \gset
SELECT is(runrow.release_run(:'once', pg_temp.token(:'once'), 'x', interval '5 seconds'), 'failed',
    'retry_in on the last attempt: failed');
SELECT is((SELECT not_before FROM runrow.agent_run WHERE id = :'once'), NULL, 'an ended run has no not_before');

SELECT * FROM finish();
ROLLBACK;
