-- A key error's two 403 rules ask one question (migration 0107, _key_has_other_answerer): is there
-- another run of the key that could answer? acquire_model_call leaves the probe to one
-- (probe_elsewhere); report_key_error's lone-run rule fails a run with none once the key's streak
-- is greatest(max_block_seconds, 600) s old. The review of session 61 (three defects, each
-- asserted broken before): (1) the run's own conversation's next turn counted for the lone-run
-- rule, so the run was refused for ever and the turn never started; (2) two runs refused with the
-- same 403 each left the other open, neither ever ended; (3) probe_elsewhere deferred a run
-- without limit to a queued run the claim never hands out. now() is fixed inside this
-- transaction: time passes by moving the key's block and streak into the past.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/key_errors.psql
SELECT plan(55);
SELECT pg_temp.drain_queue();
CREATE FUNCTION pg_temp.refused(run uuid, max_block numeric DEFAULT 300) RETURNS numeric LANGUAGE sql AS $$
    SELECT pg_temp.report(run, 'permission_error: no access to the beta', max_block)
$$;
-- The key's streak of refusals began `ago` seconds ago, its last block ended `ended` seconds ago.
-- Its refused runs' own first refusals (migration 0110) were then too.
CREATE FUNCTION pg_temp.streak_age(key text, ago int, ended int DEFAULT 1) RETURNS void LANGUAGE sql AS $$
    UPDATE runrow.rate_limit SET key_error_since = now() - make_interval(secs => ago),
        blocked_until = now() - make_interval(secs => ended), key_error_until = now() - make_interval(secs => ended)
    WHERE rate_limit_key = key;
    UPDATE runrow.agent_run SET key_error_first_refused_at = now() - make_interval(secs => ago)
    WHERE rate_limit_key = key AND key_error_refused IS NOT NULL AND status IN ('queued', 'running');
$$;

-- A refused run of the key (its probe-to-be) and a queued run of it due in an hour, the key's
-- streak a day old.
CREATE FUNCTION pg_temp.probe_and_waiter(key text, OUT probe uuid, OUT waiter uuid) LANGUAGE plpgsql AS $$
BEGIN
    probe := pg_temp.keyed_run(key);
    PERFORM pg_temp.refused(probe);
    waiter := pg_temp.keyed_run(key, claimed => false);
    PERFORM pg_temp.streak_age(key, 86400);
    UPDATE runrow.agent_run SET not_before = now() + interval '1 hour' WHERE id = waiter;
END $$;

-- (1) A run alone on its key but for its own conversation's next turn, queued behind it.
SELECT pg_temp.keyed_run('kc') AS c \gset
SELECT pg_temp.refused(:'c');
SELECT pg_temp.keyed_run('kc', (SELECT conversation_id FROM runrow.agent_run WHERE id = :'c'), false) AS nxt \gset
SELECT pg_temp.streak_age('kc', 86400);
SELECT is(pg_temp.acquire(:'c'), '(t,0,)', 'c is the probe (its next turn waits behind it)');
SELECT is(pg_temp.refused(:'c'), NULL, 'a day into the streak c''s probe refused again: its own request''s');
SELECT is(pg_temp.status(:'c'), 'failed', 'c failed once');
SELECT pg_temp.time_passes('kc');  -- the key's hold stands: the next probe tells
SELECT is((SELECT run_id FROM runrow.claim_run(worker_id => 'pgtap', lease_seconds => 30)), :'nxt'::uuid,
    'the turn behind it starts');
SELECT runrow.cancel_run(:'c'), runrow.cancel_run(:'nxt');

-- (2) Two runs of one key whose requests both draw the same own-request 403.
SELECT pg_temp.keyed_run('k2') AS a \gset
SELECT pg_temp.keyed_run('k2') AS b \gset
SELECT pg_temp.refused(:'a');   -- streak 1
SELECT pg_temp.refused(:'b');   -- on the wire
SELECT pg_temp.streak_age('k2', 599);
SELECT is(pg_temp.acquire(:'a'), '(t,0,)', 'a is the probe (b is refused too)');
SELECT isnt(pg_temp.refused(:'a'), NULL, '599 s into the streak a''s probe refused again: still a key error');
SELECT is(pg_temp.status(:'a'), 'running', 'a is not failed yet');
-- b refused too: a refusal two requests share is the key's most likely; they wait
-- give_up_after_seconds (3600) from their own first refusals, not 600 s (migration 0110).
SELECT pg_temp.streak_age('k2', 3599);
SELECT is(pg_temp.acquire(:'a'), '(t,0,)', 'a is the probe again');
SELECT isnt(pg_temp.refused(:'a'), NULL, '3599 s in, b refused too: still a key error');
SELECT is(pg_temp.status(:'a'), 'running', 'a is not failed at 3599 s');
SELECT pg_temp.streak_age('k2', 3600);
SELECT is(pg_temp.acquire(:'a'), '(t,0,)', 'a is the probe again');
SELECT is(pg_temp.refused(:'a'), NULL, '3600 s into the streak, refused again with no other run to answer: a fails');
SELECT is(pg_temp.status(:'a'), 'failed', 'a failed once');
SELECT pg_temp.streak_age('k2', 900);
SELECT is(pg_temp.acquire(:'b'), '(t,0,)', 'b is the probe');
SELECT is(pg_temp.refused(:'b'), NULL, 'b refused again: b fails too');
SELECT is(pg_temp.status(:'b'), 'failed', 'neither run waits for ever');

-- A run waiting for the key's probe hold (deferred to its end) could answer; one queued for an
-- hour from now waits for nothing of the key.
SELECT probe AS p, waiter AS q FROM pg_temp.probe_and_waiter('kh') \gset
SELECT is(pg_temp.acquire(:'p'), '(t,0,)', 'q is due in an hour: p is the probe');
SELECT is((SELECT key_probe_forced FROM runrow.rate_limit WHERE rate_limit_key = 'kh'), false,
    'the block ended 1 s ago: the probe is not forced');
UPDATE runrow.agent_run SET not_before = (SELECT blocked_until FROM runrow.rate_limit WHERE rate_limit_key = 'kh')
WHERE id = :'q';
SELECT isnt(pg_temp.refused(:'p'), NULL, 'q deferred to the probe''s hold could answer: p is not failed');
SELECT pg_temp.streak_age('kh', 86400);
UPDATE runrow.agent_run SET not_before = now() + interval '1 hour' WHERE id = :'q';
SELECT is(pg_temp.acquire(:'p'), '(t,0,)', 'p is the probe again');
SELECT is(pg_temp.refused(:'p'), NULL, 'q due an hour after the hold: p is alone and fails');
SELECT runrow.cancel_run(:'q');

-- (3) probe_elsewhere to a queued run the claim never hands out (its concurrency key is full
-- with another key's running run): bounded by the streak's age.
SELECT runrow.set_concurrency_limit('cc', 1);
SELECT e.run_id AS w FROM runrow.enqueue_run(conversation_id => gen_random_uuid(), content => '"w"',
    model => 'test-model', concurrency_key => 'cc') AS e \gset
SELECT pg_temp.claim(:'w');
SELECT pg_temp.keyed_run('kq') AS r \gset
SELECT pg_temp.refused(:'r', 900);
SELECT is((SELECT key_error_max_block FROM runrow.rate_limit WHERE rate_limit_key = 'kq'), 900::numeric,
    'the key keeps the max_block_seconds it was given');
SELECT e.run_id AS o FROM runrow.enqueue_run(conversation_id => gen_random_uuid(), content => '"o"',
    model => 'test-model', rate_limit_key => 'kq', concurrency_key => 'cc') AS e \gset
SELECT pg_temp.streak_age('kq', 899, 3600);
SELECT is(pg_temp.acquire(:'r'), '(f,15,probe_elsewhere)', '899 s into the streak (max_block 900), r leaves the probe to o');
SELECT pg_temp.streak_age('kq', 86400, 1);
SELECT is(pg_temp.acquire(:'r'), '(f,15,probe_elsewhere)',
    'a day into it, the block ended 1 s ago: o still has its chance');
SELECT pg_temp.streak_age('kq', 900, 16);
SELECT is(pg_temp.acquire(:'r'), '(t,0,)', '900 s into the streak, the block over 16 s with no probe: r is the probe');
SELECT is((SELECT key_probe_by FROM runrow.rate_limit WHERE rate_limit_key = 'kq'), :'r'::uuid, 'the key''s probe');
SELECT is((SELECT key_probe_forced FROM runrow.rate_limit WHERE rate_limit_key = 'kq'), true,
    'the key says the probe was forced');
-- The lone-run rule counts only running runs for a forced probe (migration 0110): o, which the
-- claim does not hand out, kept r refused, an API call a block, for ever.
SELECT is(pg_temp.refused(:'r', 900), NULL, 'refused, the probe forced: o does not count, r fails');
SELECT is(pg_temp.status(:'r'), 'failed', 'r failed once');
SELECT is(pg_temp.status(:'o'), 'queued', 'o still waits for its concurrency key');
SELECT runrow.cancel_run(:'o'), runrow.cancel_run(:'w');


-- (4) The age is the run's own (migration 0110): measured from the key's streak, once the key had
-- refused 600 s every run already refused failed at its next probe, a run enqueued late in an
-- outage at its second refusal.
SELECT pg_temp.keyed_run('kl') AS l1 \gset
SELECT pg_temp.refused(:'l1');
SELECT pg_temp.streak_age('kl', 86400);
UPDATE runrow.agent_run SET key_error_first_refused_at = now() - interval '599 seconds' WHERE id = :'l1';
SELECT is(pg_temp.acquire(:'l1'), '(t,0,)', 'l1 is the probe');
SELECT isnt(pg_temp.refused(:'l1'), NULL, 'the key refusing a day, l1 599 s: still a key error');
SELECT is((SELECT key_error_first_refused_at FROM runrow.agent_run WHERE id = :'l1'), now() - interval '599 seconds',
    'the same 403 again, nothing answered: l1''s first refusal is kept');
UPDATE runrow.agent_run SET key_error_first_refused_at = now() - interval '600 seconds' WHERE id = :'l1';
SELECT pg_temp.time_passes('kl');
SELECT is(pg_temp.acquire(:'l1'), '(t,0,)', 'l1 is the probe again');
SELECT is(pg_temp.refused(:'l1'), NULL, 'l1 refused 600 s: it fails');
SELECT pg_temp.time_passes('kl');  -- the hold l1's last probe left
SELECT pg_temp.keyed_run('kl') AS l2 \gset
SELECT pg_temp.refused(:'l2');
SELECT is((SELECT key_error_first_refused_at FROM runrow.agent_run WHERE id = :'l2'), now(),
    'a run refused first a day into the key''s streak: its age starts now');
-- Another 403, or a refusal after the key answered, starts the run's age again.
UPDATE runrow.agent_run SET key_error_first_refused_at = now() - interval '100 seconds' WHERE id = :'l2';
SELECT runrow.report_key_error(:'l2', pg_temp.token(:'l2'), 'permission_error: no access to the tool', 5, 300, true);
SELECT is((SELECT key_error_first_refused_at FROM runrow.agent_run WHERE id = :'l2'), now(), 'another 403: now');
UPDATE runrow.agent_run SET key_error_first_refused_at = now() - interval '100 seconds' WHERE id = :'l2';
UPDATE runrow.rate_limit SET key_answers = key_answers + 1 WHERE rate_limit_key = 'kl';
SELECT runrow.report_key_error(:'l2', pg_temp.token(:'l2'), 'permission_error: no access to the tool', 5, 300, true);
SELECT is((SELECT key_error_first_refused_at FROM runrow.agent_run WHERE id = :'l2'), now(),
    'the same 403 after the key answered (a new streak): now');
SELECT is((SELECT key_error_first_refused_at FROM runrow.agent_run WHERE id = :'l2' AND status = 'running'), now(),
    'and l2 is still running');
SELECT runrow.report_key_error(:'l2', pg_temp.token(:'l2'), 'authentication_error: invalid x-api-key', 5, 300);
SELECT is((SELECT key_error_first_refused_at FROM runrow.agent_run WHERE id = :'l2'), NULL, 'a 401: NULL');
SELECT runrow.cancel_run(:'l2');

-- give_up_after_seconds: with other runs of the key refused too, the limit is it, not 600 s.
CREATE FUNCTION pg_temp.refused_giving_up(run uuid, give_up numeric) RETURNS numeric LANGUAGE sql AS $$
    SELECT runrow.report_key_error(run, pg_temp.token(run), 'permission_error: no access to the beta', 5, 300, true,
        give_up)
$$;
SELECT pg_temp.keyed_run('kg') AS g1 \gset
SELECT pg_temp.keyed_run('kg') AS g2 \gset
SELECT pg_temp.refused(:'g1'), pg_temp.refused(:'g2');
SELECT pg_temp.streak_age('kg', 1199);
SELECT is(pg_temp.acquire(:'g1'), '(t,0,)', 'g1 is the probe');
SELECT isnt(pg_temp.refused_giving_up(:'g1', 1200), NULL, 'giving up after 1200 s: at 1199 s g1 is not failed');
SELECT pg_temp.streak_age('kg', 1200);
SELECT is(pg_temp.acquire(:'g1'), '(t,0,)', 'g1 is the probe again');
SELECT is(pg_temp.refused_giving_up(:'g1', 1200), NULL, 'at 1200 s g1 fails');
SELECT runrow.cancel_run(:'g2');

-- (5) A run deferred to the end of a 429 block on the key (up to a day) cannot answer the key
-- error's probe: the helper reads the hold's end (key_error_until), not blocked_until.
SELECT probe AS f, waiter AS d FROM pg_temp.probe_and_waiter('k5') \gset
SELECT is(pg_temp.acquire(:'f'), '(t,0,)', 'f is the probe');
UPDATE runrow.rate_limit SET rate_blocked_until = now() + interval '1 day', blocked_until = now() + interval '1 day'
WHERE rate_limit_key = 'k5';
UPDATE runrow.agent_run SET not_before = now() + interval '1 day' WHERE id = :'d';
SELECT is(pg_temp.refused(:'f'), NULL, 'd waits for the 429 block''s end, a day away: f is alone and fails');
SELECT runrow.cancel_run(:'d');

-- (6) The helper itself, asked directly: who counts as another run of the key that could answer.
CREATE FUNCTION pg_temp.answerer(run uuid, conv uuid, running_only boolean, refused boolean) RETURNS boolean
LANGUAGE sql AS $$
    SELECT runrow._key_has_other_answerer(l, run, conv, running_only, refused)
    FROM runrow.rate_limit AS l WHERE l.rate_limit_key = 'k6'
$$;
SELECT has_function('runrow', '_key_has_other_answerer',
    ARRAY['runrow.rate_limit', 'uuid', 'uuid', 'boolean', 'boolean'], '_key_has_other_answerer exists');
SELECT ok(NOT has_function_privilege('runrow_worker',
    'runrow._key_has_other_answerer(runrow.rate_limit, uuid, uuid, boolean, boolean)', 'EXECUTE'),
    'it is private: the worker cannot call it');
SELECT pg_temp.keyed_run('k6') AS g \gset
SELECT pg_temp.keyed_run('k6') AS h \gset
SELECT conversation_id AS g_conv FROM runrow.agent_run WHERE id = :'g' \gset
SELECT conversation_id AS h_conv FROM runrow.agent_run WHERE id = :'h' \gset
SELECT pg_temp.refused(:'g');
SELECT is(pg_temp.answerer(:'g', :'g_conv', false, false), true, 'another conversation''s running run counts');
SELECT is(pg_temp.answerer(:'g', :'h_conv', false, false), false, 'not when it is of the asking run''s conversation');
SELECT is(pg_temp.answerer(:'g', :'g_conv', false, true), false, 'nor as a refused run: it was not refused');
SELECT pg_temp.refused(:'h');
SELECT is(pg_temp.answerer(:'g', :'g_conv', false, false), false, 'refused since the key''s last answer, it no longer counts');
SELECT is(pg_temp.answerer(:'g', :'g_conv', false, true), true, 'but counts as another refused run');
SELECT pg_temp.keyed_run('k6', claimed => false) AS q \gset
SELECT is(pg_temp.answerer(:'g', :'g_conv', false, false), true, 'a claimable queued run of the key counts');
SELECT is(pg_temp.answerer(:'g', :'g_conv', true, false), false, 'but not when only running runs may');
SELECT * FROM finish();
ROLLBACK;
