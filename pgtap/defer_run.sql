-- runrow.defer_run: a fleet limit's wait hands the run back without spending an attempt.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(32);
SELECT pg_temp.drain_queue();

SELECT has_function('runrow', 'defer_run', ARRAY['uuid', 'uuid', 'interval', 'text'],
    'defer_run(run_id, claim_token, retry_in, reason) exists');
SELECT isnt(obj_description('runrow.defer_run(uuid, uuid, interval, text)'::regprocedure, 'pg_proc'), NULL,
    'it has a COMMENT stating its contract');

-- A run on its one attempt (max_attempts = 1) waits out a rate limit: queued, attempt given
-- back, not claimable before retry_in. release_run ended it failed (the fleet-limits audit).
SELECT pg_temp.running() AS one \gset
SELECT is(runrow.defer_run(:'one', pg_temp.token(:'one'), interval '1 minute', 'rate_limited: waiting 60.0s'),
    'deferred', 'deferred');
SELECT is((SELECT (status, attempt, max_attempts, claim_token, finished_at, error)::text
           FROM runrow.agent_run WHERE id = :'one'),
    ('queued', 0, 1, NULL::uuid, NULL::timestamptz, 'rate_limited: waiting 60.0s')::text,
    'queued again with its attempt given back, the claim cleared, the reason kept');
SELECT is((SELECT not_before FROM runrow.agent_run WHERE id = :'one'), now() + interval '1 minute',
    'not claimable before the database''s now() + retry_in');
SELECT is(pg_temp.last_event(:'one'),
    jsonb_build_object('type', 'run_requeued', 'attempt', 0, 'max_attempts', 1,
        'error', 'rate_limited: waiting 60.0s', 'not_before', now() + interval '1 minute', 'deferred', true),
    'run_requeued journaled, marked deferred');
SELECT is(pg_temp.count_events(:'one', 'complete'), 0, 'no complete event');
SELECT is_empty($$SELECT * FROM runrow.claim_runs('pgtap', 10)$$, 'not claimed before retry_in');
UPDATE runrow.agent_run SET not_before = now() WHERE id = :'one';
CREATE TEMP TABLE again AS SELECT * FROM runrow.claim_run('w2', 30);
SELECT is((SELECT (run_id, attempt)::text FROM again), (:'one'::uuid, 1)::text,
    'once due it is claimed on attempt 1 of 1 again');

-- A deferral past a block of the run's key ends with the block, so a block that ends early
-- (here set_rate_limit removes the key's row, a 429's block with it; a key error's probe answer
-- in pgtap/report_key_error.sql) makes it due with the runs held to the block's end.
SELECT pg_temp.running() AS blk \gset
SELECT runrow.report_rate_limited(:'blk', pg_temp.token(:'blk'), 60);
SELECT is(runrow.defer_run(:'blk', pg_temp.token(:'blk'), interval '61 seconds', 'blocked: waiting 60.0s'),
    'deferred', 'deferred past the key''s block');
SELECT is((SELECT not_before FROM runrow.agent_run WHERE id = :'blk'), now() + interval '60 seconds',
    'not claimable before the block''s end, not now() + retry_in');
SELECT runrow.set_rate_limit('test-model', NULL, NULL, NULL);
SELECT is((SELECT not_before <= now() FROM runrow.agent_run WHERE id = :'blk'), true,
    'the block removed: due now');
SELECT runrow.cancel_run(:'blk');

-- A run told the block (acquire_model_call: blocked) that defers after the block was removed:
-- the removal's lift ran before the run was queued, so the run is due at once, not retry_in
-- later. A grant in between makes a later deferral the run's own: it keeps its retry_in.
SELECT pg_temp.running() AS told \gset
SELECT pg_temp.running() AS own \gset
SELECT runrow.report_rate_limited(:'told', pg_temp.token(:'told'), 60);
SELECT is((SELECT reason FROM runrow.acquire_model_call(:'told', pg_temp.token(:'told'), 10)), 'blocked',
    'told to wait for the block');
SELECT is((SELECT reason FROM runrow.acquire_model_call(:'own', pg_temp.token(:'own'), 10)), 'blocked',
    'another run told the same');
SELECT runrow.set_rate_limit('test-model', NULL, NULL, NULL);
SELECT is((SELECT granted FROM runrow.acquire_model_call(:'own', pg_temp.token(:'own'), 10)), true,
    'the block removed, the other run is granted');
SELECT runrow.defer_run(:'told', pg_temp.token(:'told'), interval '60 seconds', 'blocked: waiting 60.0s'),
    runrow.defer_run(:'own', pg_temp.token(:'own'), interval '30 seconds', 'rate_limited: waiting 30.0s');
SELECT is((SELECT array_agg((not_before <= now(), not_before = now() + interval '30 seconds') ORDER BY id = :'own')::text
           FROM runrow.agent_run WHERE id IN (:'told', :'own')),
    '{"(t,f)","(f,t)"}', 'the block lifted before the deferral: due now; after a grant: its own retry_in');
SELECT runrow.cancel_run(:'told'), runrow.cancel_run(:'own');

-- A block told, lifted, and then a bucket's wait: the deferral is for the wait, not the block.
-- The end told stayed on the run, and the deferral was made due at once (the review).
SELECT pg_temp.running() AS stale \gset
SELECT pg_temp.running() AS taker \gset
SELECT runrow.report_rate_limited(:'taker', pg_temp.token(:'taker'), 60);
SELECT runrow.acquire_model_call(:'stale', pg_temp.token(:'stale'), 10);  -- blocked: the end kept
SELECT runrow.set_rate_limit('test-model', NULL, NULL, NULL);  -- lifted
SELECT runrow.set_rate_limit('test-model', 1, NULL, NULL);  -- one request a minute
SELECT runrow.acquire_model_call(:'taker', pg_temp.token(:'taker'), 10);  -- takes it
SELECT is((SELECT reason FROM runrow.acquire_model_call(:'stale', pg_temp.token(:'stale'), 10)),
    'rate_limited', 'a bucket''s wait');
SELECT is((SELECT block_told_until FROM runrow.agent_run WHERE id = :'stale'), NULL,
    'clears the block told before');
SELECT runrow.defer_run(:'stale', pg_temp.token(:'stale'), interval '30 seconds', 'rate_limited: waiting 30.0s');
SELECT is((SELECT not_before FROM runrow.agent_run WHERE id = :'stale'), now() + interval '30 seconds',
    'and the deferral keeps its retry_in');
SELECT runrow.cancel_run(:'stale'), runrow.cancel_run(:'taker');
SELECT runrow.set_rate_limit('test-model', NULL, NULL, NULL);

-- Fenced out: the old token, a made-up one; nothing written.
SELECT pg_temp.fingerprint() AS before \gset
SELECT is(runrow.defer_run(:'one', gen_random_uuid(), interval '1 minute', 'x'), NULL, 'a wrong token: NULL');
SELECT pg_temp.token(:'one') AS tok \gset
SELECT runrow.finish_run(:'one', :'tok', 'completed');
SELECT pg_temp.fingerprint() AS before \gset
SELECT is(runrow.defer_run(:'one', :'tok', interval '1 minute', 'x'), NULL, 'a run that already ended: NULL');
SELECT is(pg_temp.fingerprint(), :'before', 'fenced-out deferrals wrote nothing');

-- A stop requested meanwhile wins.
SELECT pg_temp.running(attempts => 3) AS stop \gset
SELECT runrow.cancel_run(:'stop');
SELECT is(runrow.defer_run(:'stop', pg_temp.token(:'stop'), interval '1 minute', 'blocked'), 'cancelled',
    'a pending stop: cancelled');
SELECT is(pg_temp.last_event(:'stop') ->> 'status', 'cancelled', 'cancelled: complete journaled');

-- Bad input names the argument and writes nothing.
SELECT pg_temp.running() AS bad \gset
SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok(format('SELECT runrow.defer_run(%L, %L, NULL, %L)', :'bad', pg_temp.token(:'bad'), 'x'),
    '22004', 'retry_in must not be NULL', 'retry_in NULL');
SELECT throws_ok(format('SELECT runrow.defer_run(%L, %L, %L, %L)', :'bad', pg_temp.token(:'bad'), '0 seconds', 'x'),
    '22023', 'retry_in must be NULL or more than 0 and at most 1 day, got 00:00:00', 'retry_in 0');
SELECT throws_ok(format('SELECT runrow.defer_run(%L, %L, %L, %L)', :'bad', pg_temp.token(:'bad'), '2 days', 'x'),
    '22023', 'retry_in must be NULL or more than 0 and at most 1 day, got 2 days', 'retry_in over a day');
SELECT throws_ok(format('SELECT runrow.defer_run(%L, %L, %L, %L)', :'bad', pg_temp.token(:'bad'), '1 year -359 days', 'x'),
    '22023', 'retry_in must be NULL or more than 0 and at most 1 day, got 1 year -359 days',
    'retry_in that compares as a day but lands 6 or 7 days out');
SELECT throws_ok(format('SELECT runrow.defer_run(%L, %L, %L, %L)', :'bad', pg_temp.token(:'bad'), '1 minute', ' '),
    '22023', 'reason must be 1 to 10000 characters, not only white space', 'a reason of white space');
SELECT throws_ok(format('SELECT runrow.defer_run(%L, %L, %L, %L)', :'bad', pg_temp.token(:'bad'), '1 minute', E'\u00a0\u3000'),
    '22023', 'reason must be 1 to 10000 characters, not only white space', 'a reason of Unicode white space');
SELECT throws_ok(format('SELECT runrow.defer_run(NULL, %L, %L, %L)', pg_temp.token(:'bad'), '1 minute', 'x'),
    '22004', 'run_id must not be NULL', 'run_id NULL');
SELECT is(pg_temp.fingerprint(), :'before', 'bad input wrote nothing');

SELECT * FROM finish();
ROLLBACK;
