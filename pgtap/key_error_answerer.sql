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
SELECT plan(24);
SELECT pg_temp.drain_queue();
CREATE FUNCTION pg_temp.refused(run uuid, max_block numeric DEFAULT 300) RETURNS numeric LANGUAGE sql AS $$
    SELECT runrow.report_key_error(run, pg_temp.token(run), 'permission_error: no access to the beta', 5, max_block, true)
$$;
-- The key's streak of refusals began `ago` seconds ago, its last block ended `ended` seconds ago.
CREATE FUNCTION pg_temp.streak_age(key text, ago int, ended int DEFAULT 1) RETURNS void LANGUAGE sql AS $$
    UPDATE runrow.rate_limit SET key_error_since = now() - make_interval(secs => ago),
        blocked_until = now() - make_interval(secs => ended), key_error_until = now() - make_interval(secs => ended)
    WHERE rate_limit_key = key
$$;

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
SELECT pg_temp.streak_age('k2', 600);
SELECT is(pg_temp.acquire(:'a'), '(t,0,)', 'a is the probe again');
SELECT is(pg_temp.refused(:'a'), NULL, '600 s into the streak, refused again with no other run to answer: a fails');
SELECT is(pg_temp.status(:'a'), 'failed', 'a failed once');
SELECT pg_temp.streak_age('k2', 900);
SELECT is(pg_temp.acquire(:'b'), '(t,0,)', 'b is the probe');
SELECT is(pg_temp.refused(:'b'), NULL, 'b refused again: b fails too');
SELECT is(pg_temp.status(:'b'), 'failed', 'neither run waits for ever');

-- A run waiting for the key's probe hold (deferred to its end) could answer; one queued for an
-- hour from now waits for nothing of the key.
SELECT pg_temp.keyed_run('kh') AS p \gset
SELECT pg_temp.refused(:'p');
SELECT pg_temp.keyed_run('kh', claimed => false) AS q \gset
SELECT pg_temp.streak_age('kh', 86400);
UPDATE runrow.agent_run SET not_before = now() + interval '1 hour' WHERE id = :'q';
SELECT is(pg_temp.acquire(:'p'), '(t,0,)', 'q is due in an hour: p is the probe');
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
SELECT isnt(pg_temp.refused(:'r', 900), NULL, 'refused: o could still answer, so r is not failed (the key is probed, once a block)');
SELECT is(pg_temp.status(:'o'), 'queued', 'o still waits for its concurrency key');
SELECT * FROM finish();
ROLLBACK;
