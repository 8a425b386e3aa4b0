-- A rate block (a response's headers: report_rate_limit_exhausted; a 429: report_rate_limited)
-- reported while an API key error's hold is on the key outlives the hold's lift: the probe's
-- answer (its usage settled) ends the key error's hold, not the rate block, which the key, the
-- queued runs the hold held and a deferral all keep to its end (migration 0087). Before, the key's
-- block was one end, and the lift set it to now(): the fleet sent into the empty bucket. now() is
-- fixed inside this transaction: time passes by moving the block into the past.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(20);
SELECT pg_temp.drain_queue();

CREATE FUNCTION pg_temp.keyed_run(key text) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE run uuid;
BEGIN
    SELECT e.run_id INTO run FROM runrow.enqueue_run(
        conversation_id => gen_random_uuid(), content => '"hi"', model => 'test-model', rate_limit_key => key) AS e;
    PERFORM pg_temp.claim(run);
    RETURN run;
END $$;
CREATE FUNCTION pg_temp.acquire(run uuid) RETURNS text LANGUAGE sql AS $$
    SELECT (a.granted, a.wait_seconds, a.reason)::text FROM runrow.acquire_model_call(run, pg_temp.token(run), 10) AS a
$$;
CREATE FUNCTION pg_temp.key_error(run uuid) RETURNS numeric LANGUAGE sql AS $$
    SELECT runrow.report_key_error(run, pg_temp.token(run), 'authentication_error: invalid x-api-key', 5, 20)
$$;
CREATE FUNCTION pg_temp.answered(run uuid) RETURNS void LANGUAGE sql AS $$
    SELECT runrow.append_step(run, pg_temp.token(run), 'model_turn',
        json_build_array(json_build_object('type', 'text', 'text', 'ok')), NULL,
        '{"input_tokens": 3, "output_tokens": 2}', 'end_turn')
$$;
CREATE FUNCTION pg_temp.block_left(key text) RETURNS numeric LANGUAGE sql AS $$
    SELECT extract(EPOCH FROM l.blocked_until - now()) FROM runrow.rate_limit AS l WHERE l.rate_limit_key = key
$$;
-- The key error's block is over (moved into the past): the next grant is its probe.
CREATE FUNCTION pg_temp.hold_ends(key text) RETURNS void LANGUAGE sql AS $$
    UPDATE runrow.rate_limit SET blocked_until = now() - interval '1 second',
        key_error_until = now() - interval '1 second' WHERE rate_limit_key = key
$$;
-- A queued run of the key the claim held to the key's block's end.
CREATE FUNCTION pg_temp.held_run(key text) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE run uuid;
BEGIN
    SELECT e.run_id INTO run FROM runrow.enqueue_run(conversation_id => gen_random_uuid(), content => '"q"',
        model => 'test-model', rate_limit_key => key) AS e;
    UPDATE runrow.agent_run SET not_before = (SELECT blocked_until FROM runrow.rate_limit WHERE rate_limit_key = key)
    WHERE id = run;
    RETURN run;
END $$;

-- The key error, its block over, the probe granted: the key is held for the probe's block (5 s).
SELECT pg_temp.keyed_run('kh') AS p \gset
SELECT pg_temp.keyed_run('kh') AS o \gset
SELECT pg_temp.keyed_run('kh') AS t \gset
SELECT pg_temp.key_error(:'p');
SELECT pg_temp.hold_ends('kh');
SELECT is(pg_temp.acquire(:'p'), '(t,0,)', 'the probe is granted');
SELECT is(pg_temp.block_left('kh'), 5.000000, 'the key is held for the probe''s block');
-- The probe's own answer says the requests bucket is empty: a 2 s header block, inside the hold.
SELECT runrow.report_rate_limit_exhausted(:'p', pg_temp.token(:'p'), 2);
SELECT is(pg_temp.block_left('kh'), 5.000000, 'the hold, longer, is the key''s block');
SELECT is(pg_temp.acquire(:'t'), '(f,5.000,blocked)', 'a run told the hold''s end');
SELECT pg_temp.held_run('kh') AS h \gset
-- The probe's answer settles: the key works, the hold goes, the header block stays.
SELECT pg_temp.answered(:'p');
SELECT is((SELECT (key_errors, key_probe_by)::text FROM runrow.rate_limit WHERE rate_limit_key = 'kh'), '(0,)',
    'the probe answered: the key error''s streak is over');
SELECT is(pg_temp.block_left('kh'), 2.000000, 'the key stays blocked until the header block''s end');
SELECT is(pg_temp.acquire(:'o'), '(f,2.000,blocked)', 'and grants nothing before it');
SELECT is((SELECT extract(EPOCH FROM time_left) FROM runrow.rate_limit_blocks WHERE rate_limit_key = 'kh'),
    2.000000, 'rate_limit_blocks shows the header block');
SELECT is((SELECT extract(EPOCH FROM not_before - now()) FROM runrow.agent_run WHERE id = :'h'), 2.000000,
    'a queued run the hold held is held to the header block''s end, not the hold''s');
SELECT is(runrow.defer_run(:'t', pg_temp.token(:'t'), interval '5.25 seconds', 'blocked: waiting 5.0s'), 'deferred',
    'the run told the hold''s end defers');
SELECT is((SELECT extract(EPOCH FROM not_before - now()) FROM runrow.agent_run WHERE id = :'t'), 2.000000,
    'until the header block''s end');
-- The header block over, the key grants again.
UPDATE runrow.rate_limit SET blocked_until = now() - interval '1 second', rate_blocked_until = now() - interval '1 second',
    refilled_at = now() - interval '1 second' WHERE rate_limit_key = 'kh';
SELECT is(pg_temp.acquire(:'o'), '(t,0,)', 'after the header block the key grants');

-- A key error while a header block is in force: its block is never shorter than the header's.
SELECT pg_temp.keyed_run('kr') AS r \gset
SELECT runrow.report_rate_limit_exhausted(:'r', pg_temp.token(:'r'), 40);
SELECT is(pg_temp.key_error(:'r'), 40.000, 'a key error during a longer header block is told its end');
SELECT is((SELECT extract(EPOCH FROM key_error_until - now()) FROM runrow.rate_limit WHERE rate_limit_key = 'kr'),
    5.000000, 'the key error''s own block is the first block');

-- A limited key (600 requests and 6000 input tokens a minute): the header block reported during
-- the probe's hold set the refill to the hold's end; the probe answered, the buckets refill from
-- the header block's end, not the lifted hold's (the review of session 59: a minute of
-- (f,0.100,rate_limited) answers, every waiter polling every 0.1 s).
SELECT runrow.set_rate_limit('kp', 600, 6000, NULL);
SELECT pg_temp.keyed_run('kp') AS kp \gset
SELECT pg_temp.keyed_run('kp') AS ko \gset
SELECT pg_temp.key_error(:'kp');
SELECT pg_temp.hold_ends('kp');
SELECT is(pg_temp.acquire(:'kp'), '(t,0,)', 'the limited key''s probe is granted');
SELECT runrow.report_rate_limit_exhausted(:'kp', pg_temp.token(:'kp'), 2);
SELECT pg_temp.answered(:'kp');
SELECT is((SELECT extract(EPOCH FROM refilled_at - now()) FROM runrow.rate_limit WHERE rate_limit_key = 'kp'),
    2.000000, 'the probe answered: the buckets refill from the header block''s end, not the hold''s');
-- Three seconds pass: the header block is over a second, ten requests are back.
UPDATE runrow.rate_limit SET blocked_until = blocked_until - interval '3 seconds',
    rate_blocked_until = rate_blocked_until - interval '3 seconds', refilled_at = refilled_at - interval '3 seconds'
WHERE rate_limit_key = 'kp';
SELECT is(pg_temp.acquire(:'ko'), '(t,0,)', 'a second after the header block the key grants');
-- A refill in the future (a block's end) counts in the wait: nothing refills before it.
UPDATE runrow.rate_limit SET requests_left = 0, refilled_at = now() + interval '30 seconds' WHERE rate_limit_key = 'kp';
SELECT is(pg_temp.acquire(:'ko'), '(f,30.100,rate_limited)',
    'requests: the wait runs from the refill''s start, not 0.1 s polls');
UPDATE runrow.rate_limit SET requests_left = 10, input_tokens_left = 0 WHERE rate_limit_key = 'kp';
SELECT is(pg_temp.acquire(:'ko'), '(f,30.100,rate_limited)', 'input tokens too');
UPDATE runrow.rate_limit SET input_tokens_left = 6000 WHERE rate_limit_key = 'kp';
SELECT is(pg_temp.acquire(:'ko'), '(t,0,)', 'a bucket with enough in it grants before its refill starts');

SELECT * FROM finish();
ROLLBACK;
