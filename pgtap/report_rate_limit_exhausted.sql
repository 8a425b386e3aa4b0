-- report_rate_limit_exhausted: a response's rate-limit headers said a bucket is empty, and the
-- key is blocked fleet-wide until its reset, before any 429. Happy path, fenced out, bad input
-- (nothing written). now() is fixed inside this transaction: time passes by moving the block
-- into the past.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(54);
SELECT pg_temp.drain_queue();

CREATE FUNCTION pg_temp.limits_fingerprint() RETURNS text LANGUAGE sql AS $$
    SELECT concat_ws('|', pg_temp.fingerprint(),
        (SELECT md5(coalesce(string_agg(to_jsonb(l)::text, '' ORDER BY l.rate_limit_key), '')) FROM runrow.rate_limit AS l))
$$;
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
CREATE FUNCTION pg_temp.exhausted(run uuid, secs numeric) RETURNS void LANGUAGE sql AS $$
    SELECT runrow.report_rate_limit_exhausted(run, pg_temp.token(run), secs)
$$;
CREATE FUNCTION pg_temp.block(key text) RETURNS text LANGUAGE sql AS $$
    SELECT (extract(EPOCH FROM l.blocked_until - now()), l.blocked_by_run, l.blocks_reported, l.requests_left)::text
    FROM runrow.rate_limit AS l WHERE l.rate_limit_key = key
$$;

SELECT has_function('runrow', 'report_rate_limit_exhausted', ARRAY['uuid', 'uuid', 'numeric', 'integer'],
    'report_rate_limit_exhausted exists');

-- A limited key: the response of a granted call says the bucket is empty, for 12 s.
SELECT runrow.set_rate_limit('rk', 100, NULL, NULL);
SELECT pg_temp.keyed_run('rk') AS a \gset
SELECT pg_temp.keyed_run('rk') AS b \gset
SELECT is(pg_temp.acquire(:'a'), '(t,0,)', 'a call is granted');
SELECT lives_ok(format('SELECT pg_temp.exhausted(%L, 12)', :'a'), 'its response said a bucket is empty');
SELECT is(pg_temp.acquire(:'b'), '(f,12.000,blocked)', 'every other run of the key is told the reset');
SELECT is(pg_temp.block('rk'), format('(12.000000,%s,0,0)', :'a'),
    'blocked for reset_in_seconds by the run; not counted as a 429; the requests bucket emptied');
SELECT isnt((SELECT model_call_reserved FROM runrow.agent_run WHERE id = :'a'), NULL,
    'the reporting run keeps its reservation: the answer is billed');
SELECT is((SELECT count(*)::int FROM runrow.rate_limit_blocks WHERE rate_limit_key = 'rk'), 1,
    'rate_limit_blocks shows the block');
SELECT pg_temp.exhausted(:'a', 5);
SELECT is(pg_temp.block('rk'), format('(12.000000,%s,0,0)', :'a'), 'a shorter reset never shortens the block');
SELECT pg_temp.exhausted(:'a', 30);
SELECT is(pg_temp.block('rk'), format('(30.000000,%s,0,0)', :'a'), 'a later reset lengthens it');
SELECT runrow.report_rate_limited(:'b', pg_temp.token(:'b'), 40);
SELECT is(pg_temp.block('rk'), format('(40.000000,%s,1,0)', :'b'), 'a 429 after it is counted as one');
UPDATE runrow.rate_limit SET blocked_until = now() - interval '0.3 seconds', refilled_at = now() - interval '0.3 seconds'
WHERE rate_limit_key = 'rk';
SELECT is(pg_temp.acquire(:'b'), '(f,0.300,rate_limited)',
    'after the block the requests bucket refills from empty (100 a minute: one request 0.6 s after it)');

-- A key without limits gets a block-only row; 60 s is the longest block; a tiny one is 1 ms.
SELECT pg_temp.keyed_run('fresh') AS c \gset
SELECT pg_temp.exhausted(:'c', 60);
SELECT is(pg_temp.acquire(:'c'), '(f,60.000,blocked)', 'a key without limits is blocked too, for up to 60 s');
SELECT is((SELECT (requests_per_minute, blocks_reported)::text FROM runrow.rate_limit WHERE rate_limit_key = 'fresh'),
    '(,0)', 'a block-only row');
SELECT pg_temp.keyed_run('tiny') AS t \gset
SELECT lives_ok(format('SELECT pg_temp.exhausted(%L, 1e-1000)', :'t'), 'a reset too small for a double is taken');
SELECT is((SELECT blocked_until - now() FROM runrow.rate_limit WHERE rate_limit_key = 'tiny'),
    interval '0.001 seconds', 'and blocks the key for a millisecond');

-- The header's requests limit given, a key with no requests limit of its own is paced after the
-- block at the API's refill (one request per reset_in_seconds) up to the API's bucket size, until
-- that bucket stands full: before, every slot waiting on the block was granted at its end, into
-- the empty bucket (bench/rate_limits.py, no limit set).
CREATE FUNCTION pg_temp.pace(key text) RETURNS text LANGUAGE sql AS $$
    SELECT (l.paced_requests_per_minute, l.paced_requests_limit, l.requests_left)::text
    FROM runrow.rate_limit AS l WHERE l.rate_limit_key = key
$$;
-- Time passes: every time of the key's row moves `secs` into the past.
CREATE FUNCTION pg_temp.later(key text, secs numeric) RETURNS void LANGUAGE sql AS $$
    UPDATE runrow.rate_limit
    SET blocked_until = blocked_until - make_interval(secs => secs::float8),
        rate_blocked_until = rate_blocked_until - make_interval(secs => secs::float8),
        refilled_at = refilled_at - make_interval(secs => secs::float8),
        paced_full_since = paced_full_since - make_interval(secs => secs::float8)
    WHERE rate_limit_key = key
$$;
SELECT pg_temp.keyed_run('paced') AS p \gset
SELECT pg_temp.keyed_run('paced') AS q \gset
SELECT pg_temp.keyed_run('paced') AS s \gset
SELECT lives_ok(format('SELECT runrow.report_rate_limit_exhausted(%L, %L, 2, 3)', :'p', pg_temp.token(:'p')),
    'a header block with the limit stated (3 requests, one back every 2 s)');
SELECT is(pg_temp.pace('paced'), '(30.000000,3,1)',
    'paced at one request per 2 s, up to 3, one request back at the block''s end');
SELECT is(pg_temp.acquire(:'q'), '(f,2.000,blocked)', 'the block holds every run');
SELECT pg_temp.later('paced', 2.5);
SELECT is(pg_temp.acquire(:'q'), '(t,0,)', 'at the block''s end one request is granted');
SELECT is(pg_temp.acquire(:'s'), '(f,1.500,rate_limited)',
    'the next waits for the pace (0.5 s after the block a quarter of the next request is back)');
SELECT pg_temp.later('paced', 1.5);
SELECT is(pg_temp.acquire(:'s'), '(t,0,)', 'and is granted one pace later');
SELECT is(pg_temp.acquire(:'p'), '(f,2.000,rate_limited)', 'one at a time');
SELECT pg_temp.later('paced', 6);
SELECT is(pg_temp.acquire(:'p'), '(t,0,)', 'the bucket full (3), the API''s burst is there');
SELECT is(pg_temp.pace('paced'), '(30.000000,3,2)', 'still paced: it was drawn on as it filled');
SELECT pg_temp.later('paced', 4);
SELECT is(pg_temp.acquire(:'q'), '(t,0,)', 'a request''s time after it was full again, unused');
SELECT is(pg_temp.pace('paced'), '(,,0)', 'the pace is over: the key is not limited');
SELECT runrow.report_rate_limit_exhausted(:'p', pg_temp.token(:'p'), 0.5, 1);
SELECT is(pg_temp.pace('paced'), '(120.000000,1,1)', 'a new report sets the pace anew');
SELECT pg_temp.later('paced', 0.75);
SELECT is(pg_temp.acquire(:'q'), '(t,0,)', 'with a limit of 1 the bucket is full as the block ends');
SELECT is(pg_temp.acquire(:'s'), '(f,0.500,rate_limited)', 'and is still paced: the next one a pace later');
-- The pace ends once the bucket has stood full for a request's time, however often it is locked
-- meanwhile (a settle, a waiting poll): before, that needed one gap as long between two locks,
-- and a busy key's pace never ended (the review of session 59).
SELECT runrow.report_rate_limit_exhausted(:'p', pg_temp.token(:'p'), 2, 3);
SELECT pg_temp.later('paced', 6);
SELECT runrow._lock_bucket('paced');
SELECT is((SELECT (requests_left, extract(EPOCH FROM now() - paced_full_since))::text
    FROM runrow.rate_limit WHERE rate_limit_key = 'paced'), '(3,0.000000)', 'the bucket is full, since now');
SELECT pg_temp.later('paced', 1.5);
SELECT runrow._lock_bucket('paced');
SELECT is(pg_temp.pace('paced'), '(30.000000,3,3)', 'full for 1.5 s of a 2 s pace: still paced');
SELECT pg_temp.later('paced', 1.5);
SELECT runrow._lock_bucket('paced');
SELECT is(pg_temp.pace('paced'), '(,,0)', 'full for 3 s, locked every 1.5 s: the pace is over');
SELECT runrow.report_rate_limit_exhausted(:'p', pg_temp.token(:'p'), 2, 3);
SELECT pg_temp.later('paced', 6);
SELECT runrow._lock_bucket('paced');
SELECT is(pg_temp.acquire(:'q'), '(t,0,)', 'a grant draws on the full bucket');
SELECT is((SELECT paced_full_since FROM runrow.rate_limit WHERE rate_limit_key = 'paced'), NULL,
    'and it no longer stands full since then');
SELECT runrow.report_rate_limit_exhausted(:'a', pg_temp.token(:'a'), 2, 50);
SELECT is((SELECT (paced_requests_per_minute, requests_left)::text FROM runrow.rate_limit WHERE rate_limit_key = 'rk'),
    '(,0)', 'a key with a requests limit of its own keeps it: no pace, the bucket empty');

-- An operator sees the pace (rate_limits.paced_interval, its last column: migration 0092): before,
-- a paced key read as one with no requests limit. And set_rate_limit replaces it: before, a
-- requests limit set only shadowed it (the bucket started full, into the API's empty one) and
-- the pace came back when that limit was removed.
CREATE FUNCTION pg_temp.shown(key text) RETURNS text LANGUAGE sql AS $$
    SELECT (v.requests_per_minute, v.paced_interval)::text FROM runrow.rate_limits AS v WHERE v.rate_limit_key = key
$$;
SELECT pg_temp.keyed_run('shown') AS sh \gset
SELECT runrow.report_rate_limit_exhausted(:'sh', pg_temp.token(:'sh'), 2, 3);
SELECT is(pg_temp.shown('shown'), '(,00:00:02)', 'rate_limits shows the pace: one request every 2 s');
SELECT is(pg_temp.shown('rk'), '(100,)', 'and no pace on a key with a requests limit of its own');
SELECT is((SELECT attname::text FROM pg_attribute WHERE attrelid = 'runrow.rate_limits'::regclass
    ORDER BY attnum DESC LIMIT 1), 'paced_interval', 'appended after the view''s other columns');
SELECT pg_temp.later('shown', 3);
SELECT runrow.set_rate_limit('shown', 100, NULL, NULL);
SELECT is(pg_temp.pace('shown'), '(,,1.500000)',
    'a requests limit set ends the pace; the bucket keeps what the pace refilled (1 + 1 s at 30 a minute)');
SELECT is(pg_temp.shown('shown'), '(100,)', 'rate_limits shows the limit, not the pace');
SELECT runrow.set_rate_limit('shown', NULL, 1000, NULL);
SELECT is(pg_temp.pace('shown'), '(,,0)', 'the requests limit removed: not paced, the requests not limited');
SELECT runrow.report_rate_limit_exhausted(:'sh', pg_temp.token(:'sh'), 2, 3);
SELECT is(pg_temp.shown('shown'), '(,00:00:02)', 'paced again after another header block');
SELECT runrow.set_rate_limit('shown', NULL, 2000, NULL);
SELECT is(pg_temp.pace('shown'), '(,,0)', 'a token limit changed with no requests limit ends it too');
SELECT is(pg_temp.shown('shown'), '(,)', 'and rate_limits shows none');

-- Fenced out: a stale token, and a run that has ended, write nothing.
SELECT pg_temp.finished('completed') AS done \gset
SELECT pg_temp.limits_fingerprint() AS before \gset
SELECT lives_ok(format('SELECT runrow.report_rate_limit_exhausted(%L, gen_random_uuid(), 10)', :'b'),
    'a stale token is not an error');
SELECT lives_ok(format('SELECT runrow.report_rate_limit_exhausted(%L, gen_random_uuid(), 10)', :'done'),
    'nor is an ended run');
SELECT is(pg_temp.limits_fingerprint(), :'before', 'fenced-out reports wrote nothing');

-- Bad input: standard SQLSTATEs naming the argument, nothing written.
SELECT throws_ok(format('SELECT pg_temp.exhausted(%L, 0)', :'b'), '22023',
    'reset_in_seconds must be more than 0 and at most 60, got 0', 'a zero reset');
SELECT throws_ok(format('SELECT pg_temp.exhausted(%L, 60.001)', :'b'), '22023',
    'reset_in_seconds must be more than 0 and at most 60, got 60.001', 'a reset past a minute');
SELECT throws_ok(format('SELECT pg_temp.exhausted(%L, %L)', :'b', 'NaN'), '22023',
    'reset_in_seconds must be more than 0 and at most 60, got NaN', 'a NaN reset');
SELECT throws_ok(format('SELECT pg_temp.exhausted(%L, NULL)', :'b'), '22004',
    'reset_in_seconds must not be NULL', 'a NULL reset');
SELECT throws_ok(format('SELECT runrow.report_rate_limit_exhausted(%L, %L, 1, 0)', :'b', pg_temp.token(:'b')), '22023',
    'requests_limit must be NULL or a finite number more than 0, got 0', 'a zero requests_limit');
SELECT throws_ok('SELECT runrow.report_rate_limit_exhausted(NULL, gen_random_uuid(), 1)', '22004',
    'run_id must not be NULL', 'a NULL run_id');
SELECT is(pg_temp.limits_fingerprint(), :'before', 'bad input wrote nothing');

SELECT * FROM finish();
ROLLBACK;
