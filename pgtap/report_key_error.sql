-- report_key_error (API key and account errors block the key fleet-wide, growing while they
-- last), the probe acquire_model_call lets through after a block, and the end of the streak when
-- a usage settles. Happy path, fenced out, bad input (nothing written). now() is fixed inside this
-- transaction: time passes by moving the block into the past.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/key_errors.psql
SELECT plan(100);
SELECT pg_temp.drain_queue();

CREATE FUNCTION pg_temp.streak(key text) RETURNS text LANGUAGE sql AS $$
    SELECT (l.key_errors, l.key_error_block::float8, l.key_probe_by IS NOT NULL,
            extract(EPOCH FROM l.blocked_until - now()))::text
    FROM runrow.rate_limit AS l WHERE l.rate_limit_key = key
$$;

SELECT has_function('runrow', 'report_key_error', ARRAY['uuid', 'uuid', 'text', 'numeric', 'numeric', 'boolean', 'numeric'],
    'report_key_error exists');

-- The first error blocks the key for the first block; the key had no row.
SELECT pg_temp.keyed_run('kk') AS a \gset
SELECT pg_temp.keyed_run('kk') AS b \gset
SELECT pg_temp.keyed_run('kk') AS c \gset
SELECT is(pg_temp.report(:'a'), 5.000, 'the first key error blocks for first_block_seconds');
SELECT is(pg_temp.streak('kk'), '(1,5,f,5.000000)', 'streak 1, no probe out');
SELECT is((SELECT (key_error, blocked_by_run::text, key_errors)::text FROM runrow.rate_limit_blocks
    WHERE rate_limit_key = 'kk'), format('("authentication_error: invalid x-api-key",%s,1)', :'a'),
    'rate_limit_blocks shows the key error and who reported it');
SELECT is(pg_temp.acquire(:'b'), '(f,5.000,blocked)', 'every run of the key is held');
-- A request that was on the wire before the block: the block stands, no growth.
SELECT is(pg_temp.report(:'b', 'billing_error: Your credit balance is too low'), 5.000,
    'a report during the block keeps the block');
SELECT is(pg_temp.streak('kk'), '(1,5,f,5.000000)', 'and does not grow the streak');
SELECT is((SELECT key_error FROM runrow.rate_limit WHERE rate_limit_key = 'kk'),
    'billing_error: Your credit balance is too low', 'the latest message is kept');

-- After the block: one probe is granted, the others held for one more block.
SELECT pg_temp.time_passes('kk');
SELECT is(pg_temp.acquire(:'b'), '(t,0,)', 'after the block one request (the probe) is granted');
SELECT is(pg_temp.streak('kk'), '(1,5,t,5.000000)', 'the probe is out: the key is held a block more');
SELECT is(pg_temp.acquire(:'c'), '(f,5.000,blocked)', 'another run is held while the probe is out');
-- The probe fails: the block doubles, up to max_block_seconds.
SELECT is(pg_temp.report(:'b'), 10.000, 'the probe failing doubles the block');
SELECT is(pg_temp.streak('kk'), '(2,10,f,10.000000)', 'streak 2');
SELECT pg_temp.time_passes('kk');
SELECT is(pg_temp.report(:'c'), 20.000, 'a failure after the block grows it again');
SELECT pg_temp.time_passes('kk');
SELECT is(pg_temp.report(:'c'), 20.000, 'capped at max_block_seconds');
SELECT is((SELECT key_errors FROM runrow.rate_limit WHERE rate_limit_key = 'kk'), 4, 'streak 4');

-- A queued run the claim held to the block's end, and the probe answered: the streak is over,
-- its hold lifted, the queued run due now.
SELECT pg_temp.time_passes('kk');
SELECT is(pg_temp.acquire(:'c'), '(t,0,)', 'the next probe is granted');
SELECT e.run_id AS q FROM runrow.enqueue_run(conversation_id => gen_random_uuid(), content => '"q"',
    model => 'test-model', rate_limit_key => 'kk') AS e \gset
UPDATE runrow.agent_run SET not_before = (SELECT blocked_until FROM runrow.rate_limit WHERE rate_limit_key = 'kk')
WHERE id = :'q';
SELECT pg_temp.answered(:'c');
SELECT is((SELECT (key_errors, key_error, key_error_since, key_error_until, key_error_block, key_probe_by,
    blocked_until <= now())::text FROM runrow.rate_limit WHERE rate_limit_key = 'kk'), '(0,,,,,,t)',
    'the probe answered: the streak is over and its hold lifted');
SELECT is((SELECT not_before <= now() FROM runrow.agent_run WHERE id = :'q'), true,
    'a queued run held to the hold''s end is due now');
SELECT is(pg_temp.acquire(:'a'), '(t,0,)', 'the key grants again, with no probe');
SELECT is(pg_temp.streak('kk'), '(0,,f,0.000000)', 'and holds nobody');
SELECT is(pg_temp.report(:'a'), 5.000, 'a new error starts a new streak at the first block');

-- A request granted before the key broke, answered after: not the probe, so it proves nothing.
SELECT pg_temp.keyed_run('kold') AS x \gset
SELECT pg_temp.keyed_run('kold') AS y \gset
SELECT is(pg_temp.acquire(:'x'), '(t,0,)', 'a request granted before the key broke');
SELECT pg_temp.report(:'y');
SELECT pg_temp.answered(:'x');
SELECT is(pg_temp.streak('kold'), '(1,5,f,5.000000)',
    'its answer, settled after the error, neither ends the streak nor lifts the block');

-- A run deferred (defer_run) while the probe is out, and the probe answered: the run is due at
-- once, as one the claim held. The worker's retry_in is the wait acquire_model_call or
-- report_key_error gave it, counted from that earlier transaction's now(): its own now() + that
-- ends a little after the block. Deferred past it, the run waited a whole block more (up to
-- key_error_max_block, 300 s) after the key worked again.
SELECT pg_temp.keyed_run('kdef') AS p \gset
SELECT pg_temp.keyed_run('kdef') AS d \gset
SELECT pg_temp.keyed_run('kdef') AS e \gset
SELECT pg_temp.keyed_run('kdef') AS f \gset
SELECT pg_temp.report(:'p');
SELECT pg_temp.time_passes('kdef');
SELECT is(pg_temp.acquire(:'p'), '(t,0,)', 'the probe is granted');
SELECT is(pg_temp.acquire(:'d'), '(f,5.000,blocked)', 'another run is held for the probe''s block');
SELECT is(runrow.defer_run(:'d', pg_temp.token(:'d'), interval '5.25 seconds', 'blocked: waiting 5.0s'), 'deferred',
    'and deferred for the wait it was given');
SELECT is((SELECT a.not_before = l.blocked_until FROM runrow.agent_run AS a
    JOIN runrow.rate_limit AS l ON l.rate_limit_key = a.rate_limit_key WHERE a.id = :'d'), true,
    'a deferral past the key''s block ends with the block');
SELECT is(pg_temp.acquire(:'f'), '(f,5.000,blocked)', 'a third run is told the same wait');
SELECT is((SELECT a.block_told_until = l.blocked_until FROM runrow.agent_run AS a
    JOIN runrow.rate_limit AS l ON l.rate_limit_key = a.rate_limit_key WHERE a.id = :'f'), true,
    'and the block''s end it was told is kept on the run');
SELECT is(runrow.defer_run(:'e', pg_temp.token(:'e'), interval '2 seconds', 'blocked: waiting 2.0s'), 'deferred',
    'a deferral shorter than the block');
SELECT is((SELECT not_before FROM runrow.agent_run WHERE id = :'e'), now() + interval '2 seconds',
    'keeps its own end (the claim holds the run to the block then)');
SELECT pg_temp.answered(:'p');
SELECT is((SELECT not_before <= now() FROM runrow.agent_run WHERE id = :'d'), true,
    'the probe answered: the deferred run is due now');
-- The third run defers only now, after the probe's answer lifted the block it was told: the
-- lift ran before it was queued. It waited its whole retry_in (CI: one block late).
SELECT is(runrow.defer_run(:'f', pg_temp.token(:'f'), interval '5.25 seconds', 'blocked: waiting 5.0s'), 'deferred',
    'a run told the block defers after the probe''s answer');
SELECT is((SELECT (not_before <= now(), block_told_until IS NULL) FROM runrow.agent_run WHERE id = :'f'),
    (true, true), 'due now, not retry_in later: the block it was told was lifted meanwhile');
SELECT runrow.cancel_run(:'d'), runrow.cancel_run(:'e'), runrow.cancel_run(:'f');  -- out of the claims below

-- A refusal of one run's own request (a 403 for a beta the organisation may not use) reads like a
-- key error. Refused again after the key answered another run's request sent since, it is the
-- run's own: the run fails once and the key is not blocked again (migration 0095).
SELECT pg_temp.keyed_run('kown') AS o \gset
SELECT pg_temp.keyed_run('kown') AS o2 \gset
SELECT pg_temp.keyed_run('kown') AS s \gset
SELECT is(pg_temp.report(:'o', 'permission_error: no access to the beta'), 5.000,
    'the first refusal blocks the key: it may be the key''s');
SELECT pg_temp.report(:'o2', 'permission_error: no access to the beta');
SELECT is(pg_temp.report(:'o', 'permission_error: no access to the beta'), 5.000,
    'refused again with no answer between: still the key''s');
SELECT pg_temp.time_passes('kown');
SELECT is(pg_temp.acquire(:'s'), '(t,0,)', 'another run''s request is the probe');
SELECT pg_temp.answered(:'s');
SELECT is((SELECT (key_errors, key_answers)::text FROM runrow.rate_limit WHERE rate_limit_key = 'kown'), '(0,1)',
    'the probe answered: the streak is over, the key''s answers counted');
-- Fenced out: a stale token writes nothing, the run's own refusal or not.
SELECT is(runrow.report_key_error(:'o2', gen_random_uuid(), 'permission_error: no access to the beta'), NULL,
    'a stale token: NULL');
SELECT is((SELECT status FROM runrow.agent_run WHERE id = :'o2'), 'running', 'fenced out: the run is not ended');
SELECT is(pg_temp.report(:'o', 'permission_error: no access to the beta'), NULL,
    'refused again after the key answered: NULL, the run''s own');
SELECT is((SELECT (status, attempt, claim_token IS NULL, error)::text FROM runrow.agent_run WHERE id = :'o'),
    '(failed,1,t,"model API refused the request: permission_error: no access to the beta (refused again after '
    'the key answered another request since this run''s last refusal: the error is about this run''s request, '
    'not the key; not retried)")', 'the run fails once, saying why');
SELECT is((SELECT count(*)::int FROM runrow.run_event WHERE run_id = :'o' AND type = 'complete'), 1,
    'its end is journaled');
SELECT is(pg_temp.streak('kown'), '(0,,f,0.000000)', 'the key is not blocked for it');
SELECT is(pg_temp.report(:'o2'), 5.000,
    'a 401 after the key answered stays the key''s (a rotation half-way through the fleet)');
SELECT runrow.finish_run(:'o2', pg_temp.token(:'o2'), 'completed');  -- no run left waiting beside s
-- A run whose own request the key answered since its key error: a later one is the key's again.
SELECT pg_temp.time_passes('kown');
SELECT is(pg_temp.acquire(:'s'), '(t,0,)', 'the other run''s probe');
SELECT pg_temp.answered(:'s');
SELECT is(pg_temp.acquire(:'s'), '(t,0,)', 'asks again, no probe');
SELECT is(pg_temp.report(:'s', 'permission_error: no access to the beta'), 5.000, 'its first refusal: the key''s');
SELECT pg_temp.time_passes('kown');
SELECT is(pg_temp.acquire(:'s'), '(t,0,)', 'its own probe is granted');
SELECT pg_temp.answered(:'s');
SELECT is((SELECT key_error_answers FROM runrow.agent_run WHERE id = :'s'), NULL::bigint,
    'its own request answered: its key error is forgotten');
SELECT is(pg_temp.report(:'s', 'permission_error: no access to the beta'), 5.000,
    'refused later: the key''s again, not its own');
SELECT throws_ok(format('SELECT runrow.report_key_error(%L, %L, %L, 5, 20, NULL)', :'s', pg_temp.token(:'s'), 'x'),
    '22004', 'own_request_possible must not be NULL', 'a NULL own_request_possible');

-- The key breaks again with another 403 (workers with different API keys share the key): a run
-- the first outage left waiting, unanswered since, is not failed for it; it is a key error
-- (migration 0099: only the same 403 as the run's last refusal is its own).
SELECT pg_temp.keyed_run('kagain') AS p \gset
SELECT pg_temp.keyed_run('kagain') AS q \gset
SELECT is(pg_temp.report(:'p', 'permission_error: this organization has been disabled'), 5.000,
    'the first outage''s 403 blocks the key');
SELECT pg_temp.time_passes('kagain');
SELECT is(pg_temp.acquire(:'q'), '(t,0,)', 'another run''s probe');
SELECT pg_temp.answered(:'q');
SELECT is(pg_temp.report(:'p', 'permission_error: this API key may not be used from this workspace'), 5.000,
    'the key broken again by another 403: a key error for the run that waited, not its own');
SELECT is((SELECT (status, key_error_refused)::text FROM runrow.agent_run WHERE id = :'p'),
    '(running,"permission_error: this API key may not be used from this workspace")',
    'the run is not failed; its last refusal is kept');

-- The key breaks again with the SAME 403 text (a second outage of one organisation): a run the
-- first outage left waiting is the second streak's probe, refused with the text it saw in the
-- first. Its refusal is the new outage's, not its own (migration 0101): the key had answered
-- since its last refusal, but another request was refused since that answer. Before, it was
-- failed, and so was each run of the first outage the second one's probes met.
SELECT pg_temp.keyed_run('ktwice') AS w \gset
SELECT pg_temp.keyed_run('ktwice') AS v \gset
SELECT pg_temp.keyed_run('ktwice') AS u \gset
SELECT is(pg_temp.report(:'w', 'permission_error: this organization has been disabled'), 5.000,
    'the first outage''s 403 blocks the key');
SELECT pg_temp.time_passes('ktwice');
SELECT is(pg_temp.acquire(:'v'), '(t,0,)', 'another run''s probe');
SELECT pg_temp.answered(:'v');
SELECT is(pg_temp.report(:'v', 'permission_error: this organization has been disabled'), 5.000,
    'the key breaks again with the same 403: a new streak');
SELECT is(pg_temp.acquire(:'w'), '(f,5.000,blocked)', 'the run left waiting meets the new block');
SELECT pg_temp.time_passes('ktwice');
SELECT is(pg_temp.acquire(:'w'), '(t,0,)', 'and is the new streak''s probe');
SELECT is(pg_temp.report(:'w', 'permission_error: this organization has been disabled'), 10.000,
    'refused with the first outage''s text: the new outage''s refusal, the block doubles');
SELECT is((SELECT (status, key_error_answers)::text FROM runrow.agent_run WHERE id = :'w'), '(running,1)',
    'the run is not failed; its refusal now counts from the new streak');
-- The new outage ends (another run's probe answered), and the run is refused again with that
-- 403: the key works, so it is the run's own.
SELECT pg_temp.time_passes('ktwice');
SELECT is(pg_temp.acquire(:'w'), '(f,15,probe_elsewhere)',
    'refused a 403 since the key''s last answer: it leaves the probe to a run waiting beside it');
SELECT is(pg_temp.acquire(:'u'), '(t,0,)', 'a third run''s probe');
SELECT pg_temp.answered(:'u');
SELECT is(pg_temp.acquire(:'w'), '(t,0,)', 'the key works: the run asks');
SELECT is(pg_temp.report(:'w', 'permission_error: this organization has been disabled'), NULL,
    'refused again while the key works: the run''s own');
SELECT is(pg_temp.status(:'w'), 'failed', 'the run fails once');

-- A run alone on its key whose own request draws the 403: no other request is ever answered,
-- and it is the probe every time. Once the key's streak of refusals began greatest(
-- max_block_seconds, 600) seconds ago on the database clock and the probe is refused with the
-- same 403, it is the run's own: it fails once (migration 0099; before, it was deferred for ever,
-- one probe per longest block, its attempt given back). Timed (migration 0101): the block
-- reaching max_block_seconds was the rule, and with max_block_seconds equal to
-- first_block_seconds that failed the run on its second refusal, 5 s into an outage. Time
-- passes by backdating the streak's start (now() is fixed in this transaction).
CREATE FUNCTION pg_temp.probe_refused(run uuid, max_block numeric DEFAULT 20) RETURNS numeric
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_temp.time_passes((SELECT rate_limit_key FROM runrow.agent_run WHERE id = run));
    IF pg_temp.acquire(run) <> '(t,0,)' THEN
        RAISE EXCEPTION 'pg_temp.probe_refused: % is not the probe', run;
    END IF;
    RETURN runrow.report_key_error(run, pg_temp.token(run), 'permission_error: no access to the beta',
        least(5, max_block), max_block, true);
END $$;
-- The key's streak and its refused runs' own first refusals (migration 0110) began secs ago.
CREATE FUNCTION pg_temp.streak_began(key text, secs numeric) RETURNS void LANGUAGE sql AS $$
    UPDATE runrow.rate_limit SET key_error_since = now() - make_interval(secs => secs::float8)
    WHERE rate_limit_key = key;
    UPDATE runrow.agent_run SET key_error_first_refused_at = now() - make_interval(secs => secs::float8)
    WHERE rate_limit_key = key AND key_error_refused IS NOT NULL AND status IN ('queued', 'running');
$$;
SELECT pg_temp.keyed_run('kalone') AS z \gset
SELECT is(pg_temp.report(:'z', 'permission_error: no access to the beta'), 5.000, 'the first refusal: 5 s');
SELECT is(pg_temp.probe_refused(:'z'), 10.000, 'its probe refused: still the key''s, the block doubles');
SELECT is(pg_temp.probe_refused(:'z'), 20.000, 'the block reaches its longest');
SELECT is(pg_temp.probe_refused(:'z'), 20.000,
    'refused again at the longest block, the streak begun 0 s ago: still the key''s (the old rule failed it)');
SELECT pg_temp.streak_began('kalone', 599.999);
SELECT is(pg_temp.probe_refused(:'z'), 20.000, 'the streak begun 599.999 s ago: still the key''s');
SELECT is(pg_temp.status(:'z'), 'running', 'the run is not failed');
SELECT pg_temp.streak_began('kalone', 600);
SELECT is(pg_temp.probe_refused(:'z'), NULL,
    'the streak begun 600 s ago, nothing answered: NULL, the run''s own');
SELECT is((SELECT (status, attempt, error)::text FROM runrow.agent_run WHERE id = :'z'),
    '(failed,1,"model API refused the request: permission_error: no access to the beta (refused again as '
    'the key''s probe 600 s after this run''s first refusal, the key''s refusal 6 in a row, and no request of the '
    'key answered since this run''s last refusal: taken for this run''s request, not the key; not retried)")',
    'the run fails once, saying why');
SELECT is(pg_temp.streak('kalone'), '(5,20,f,20.000000)', 'the probe is over; the key''s hold stands');

-- key_error_max_block equal to key_error_first_block (5): the block is at its longest from the
-- first refusal. The second refusal, 5 s into the outage, is the key's.
SELECT pg_temp.keyed_run('kflat') AS z5 \gset
SELECT is(runrow.report_key_error(:'z5', pg_temp.token(:'z5'), 'permission_error: no access to the beta', 5, 5, true),
    5.000, 'the first refusal, first and longest block 5 s');
SELECT pg_temp.streak_began('kflat', 5);
SELECT is(pg_temp.probe_refused(:'z5', 5), 5.000, 'its probe refused 5 s in: the key''s, not the run''s');
SELECT pg_temp.streak_began('kflat', 599);
SELECT is(pg_temp.probe_refused(:'z5', 5), 5.000, 'nor 599 s in');
SELECT pg_temp.streak_began('kflat', 600);
SELECT is(pg_temp.probe_refused(:'z5', 5), NULL, '600 s in: the run''s own (the floor, over max_block_seconds)');
SELECT is(pg_temp.status(:'z5'), 'failed', 'the run fails once');

-- max_block_seconds over 600: the streak must have lasted that long.
SELECT pg_temp.keyed_run('klong') AS z9 \gset
SELECT is(runrow.report_key_error(:'z9', pg_temp.token(:'z9'), 'permission_error: no access to the beta', 5, 900, true),
    5.000, 'the first refusal, longest block 900 s');
SELECT pg_temp.streak_began('klong', 899.999);
SELECT is(pg_temp.probe_refused(:'z9', 900), 10.000, 'its probe refused 899.999 s in: the key''s');
SELECT pg_temp.streak_began('klong', 900);
SELECT is(pg_temp.probe_refused(:'z9', 900), NULL, '900 s in: the run''s own');

-- A 429's longer block is never shortened by a key error.
SELECT pg_temp.keyed_run('k429') AS r \gset
SELECT runrow.report_rate_limited(:'r', pg_temp.token(:'r'), 60);
SELECT is(pg_temp.report(:'r'), 60.000, 'a longer 429 block stands');

-- Fenced out: a stale token gets NULL and writes nothing.
SELECT pg_temp.fingerprint() || (SELECT md5(string_agg(to_jsonb(l)::text, '' ORDER BY l.rate_limit_key))
    FROM runrow.rate_limit AS l) AS before \gset
SELECT is(runrow.report_key_error(:'a', gen_random_uuid(), 'x'), NULL, 'a stale token: NULL');
SELECT is(pg_temp.fingerprint() || (SELECT md5(string_agg(to_jsonb(l)::text, '' ORDER BY l.rate_limit_key))
    FROM runrow.rate_limit AS l), :'before', 'fenced out: nothing written');

-- Bad input: standard SQLSTATEs naming the argument.
SELECT throws_ok(format('SELECT runrow.report_key_error(%L, %L, NULL)', :'a', pg_temp.token(:'a')), '22004',
    'error must not be NULL', 'a NULL error');
SELECT throws_ok(format('SELECT runrow.report_key_error(%L, %L, %L)', :'a', pg_temp.token(:'a'), '  '), '22023',
    'error must not be empty or only white space', 'an empty error');
SELECT throws_ok(format('SELECT runrow.report_key_error(%L, %L, %L)', :'a', pg_temp.token(:'a'), E'\n\t'), '22023',
    'error must not be empty or only white space', 'an error of tabs and newlines');
SELECT throws_ok(format('SELECT runrow.report_key_error(%L, %L, %L)', :'a', pg_temp.token(:'a'), E'\u00a0'), '22023',
    'error must not be empty or only white space', 'an error of a no-break space');
SELECT throws_ok(format('SELECT runrow.report_key_error(%L, %L, %L, 0)', :'a', pg_temp.token(:'a'), 'x'), '22023',
    'first_block_seconds must be from 0.001 to 86400, got 0', 'a zero first block');
SELECT throws_ok(format('SELECT runrow.report_key_error(%L, %L, %L, 10, 5)', :'a', pg_temp.token(:'a'), 'x'),
    '22023', 'max_block_seconds must be from first_block_seconds (10) to 86400, got 5', 'a cap under the first block');
SELECT throws_ok(format('SELECT runrow.report_key_error(%L, %L, %L, 5, 300, true, NULL)', :'a', pg_temp.token(:'a'), 'x'),
    '22004', 'give_up_after_seconds must not be NULL', 'a NULL give_up_after_seconds');
SELECT throws_ok(format('SELECT runrow.report_key_error(%L, %L, %L, 5, 300, true, 599)', :'a', pg_temp.token(:'a'), 'x'),
    '22023', 'give_up_after_seconds must be from greatest(max_block_seconds, 600) (600) to 604800, got 599',
    'a give-up under 600 s');
SELECT throws_ok(format('SELECT runrow.report_key_error(%L, %L, %L, 5, 900, true, 899)', :'a', pg_temp.token(:'a'), 'x'),
    '22023', 'give_up_after_seconds must be from greatest(max_block_seconds, 600) (900) to 604800, got 899',
    'a give-up under max_block_seconds');
SELECT throws_ok(format('SELECT runrow.report_key_error(%L, %L, %L, 5, 300, true, 604801)', :'a', pg_temp.token(:'a'), 'x'),
    '22023', 'give_up_after_seconds must be from greatest(max_block_seconds, 600) (600) to 604800, got 604801',
    'a give-up over a week');
SELECT throws_ok(format('SELECT runrow.report_key_error(%L, NULL, %L)', :'a', 'x'), '22004',
    'claim_token must not be NULL', 'a NULL claim_token');

SELECT * FROM finish();
ROLLBACK;
