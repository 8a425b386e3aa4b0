-- defer_run bounds a run's 429s without an answer between, whatever the claims and the reasons
-- (migration 0109; the review of session 61). A 429 whose retry-after is longer than the worker
-- waits in place (rate_limit_max_wait, 10 s) was deferred for ever: the agent reports it,
-- acquire_model_call answers blocked, and the agent defers the run with the reason "blocked:
-- waiting ...", its attempt given back. One 429 a claim never passed the per-claim allowance
-- (5) the cap on deferrals for 429s counts by, so each claim blocked the key for the whole fleet
-- again, without end. Now report_rate_limited counts the run's 429s since its last answered
-- model call (agent_run.unanswered_429s; a settled usage sets it back to 0), and at 24
-- ((5 + 1) x (3 + 1)) defer_run releases the run instead, its attempt spent.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/key_errors.psql
SELECT plan(29);
SELECT pg_temp.drain_queue();

-- The key's 429 block is over (now() does not move in a transaction; helpers/key_errors.psql's
-- time_passes is for a key error's streak).
CREATE FUNCTION pg_temp.block_over(key text) RETURNS void LANGUAGE sql AS $$
    UPDATE runrow.rate_limit SET blocked_until = now() - interval '1 second',
        rate_blocked_until = now() - interval '1 second' WHERE rate_limit_key = key
$$;

CREATE FUNCTION pg_temp.keyed(key text, attempts int) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE run uuid;
BEGIN
    SELECT e.run_id INTO run FROM runrow.enqueue_run(
        conversation_id => gen_random_uuid(), content => '"hi"', model => 'test-model',
        rate_limit_key => key, max_attempts => attempts) AS e;
    PERFORM pg_temp.claim(run);
    RETURN run;
END $$;
-- One claim as the agent meets a 429 whose retry-after (60 s) is over its longest wait in place:
-- the 429 reported, acquire_model_call blocked, the run deferred as blocked. The outcome of the
-- deferral; when deferred, the block is over and the run claimed again (the queue is otherwise empty).
CREATE FUNCTION pg_temp.blocked_claim(run uuid) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    key text := (SELECT rate_limit_key FROM runrow.agent_run WHERE id = run);
    outcome text;
BEGIN
    PERFORM runrow.report_rate_limited(run, pg_temp.token(run), 60);
    IF pg_temp.acquire(run) NOT LIKE '(f,%,blocked)' THEN
        RAISE EXCEPTION 'pg_temp.blocked_claim: acquire_model_call said %', pg_temp.acquire(run);
    END IF;
    outcome := runrow.defer_run(run, pg_temp.token(run), interval '60 seconds', 'blocked: waiting 60.0s for a model call');
    IF outcome = 'deferred' THEN
        UPDATE runrow.agent_run SET not_before = NULL WHERE id = run;
        PERFORM pg_temp.block_over(key);
        PERFORM pg_temp.claim(run);
    END IF;
    RETURN outcome;
END $$;
-- n such claims: 'deferred' when each was, else the first other outcome and its place.
CREATE FUNCTION pg_temp.blocked_claims(run uuid, n int) RETURNS text LANGUAGE plpgsql AS $$
DECLARE outcome text;
BEGIN
    FOR i IN 1..n LOOP
        outcome := pg_temp.blocked_claim(run);
        IF outcome IS DISTINCT FROM 'deferred' THEN
            RETURN format('%s at %s', outcome, i);
        END IF;
    END LOOP;
    RETURN 'deferred';
END $$;
CREATE FUNCTION pg_temp.counts(run uuid) RETURNS text LANGUAGE sql AS $$
    SELECT (status, attempt, unanswered_429s, cap_429_deferrals)::text FROM runrow.agent_run WHERE id = run
$$;

-- The run on its one attempt (the default): 23 claims of one 429 each are deferred, the 24th
-- is not.
SELECT pg_temp.keyed('k-one', 1) AS one \gset
SELECT is(pg_temp.blocked_claims(:'one', 23), 'deferred', '23 claims of one 429 each: each deferred');
SELECT is(pg_temp.counts(:'one'), ('running', 1, 23, 0)::text,
    'its attempt given back each time, 23 429s without an answer, none a deferral for 429s');
SELECT is(pg_temp.blocked_claim(:'one'), 'failed', 'the 24th 429 without an answer: released, not deferred');
SELECT is(pg_temp.counts(:'one'), ('failed', 1, 24, 0)::text, 'its attempt spent: its last, so failed');
SELECT is((SELECT error FROM runrow.agent_run WHERE id = :'one'),
    'blocked: waiting 60.0s for a model call (after 24 429s without an answer, the most a run is deferred for: its attempt spent)',
    'the error is the reason, naming the bound');
SELECT is((SELECT claim_token FROM runrow.agent_run WHERE id = :'one'), NULL, 'the claim is over');
SELECT is(pg_temp.last_event(:'one') ->> 'type', 'complete', 'the ending journaled');

-- Two attempts: the 24th is requeued, its attempt spent; the count stands (no answer since),
-- so the next claim that reports a 429 and defers (not for the cap) spends the last attempt.
SELECT pg_temp.keyed('k-two', 2) AS two \gset
SELECT is(pg_temp.blocked_claims(:'two', 24), 'requeued at 24', 'on a run with attempts left: requeued at the 24th');
SELECT is(pg_temp.counts(:'two'), ('queued', 1, 24, 0)::text, 'its first attempt spent');
SELECT is((SELECT (last_event ->> 'deferred') IS NULL FROM (SELECT pg_temp.last_event(:'two') AS last_event) AS e),
    true, 'a release, not a deferral, journaled');
UPDATE runrow.agent_run SET not_before = NULL WHERE id = :'two';
SELECT pg_temp.block_over('k-two');
SELECT pg_temp.claim(:'two');
-- Past the bound, a deferral that follows no 429 of its own claim blocked no one: deferred.
SELECT is(runrow.defer_run(:'two', pg_temp.token(:'two'), interval '15 seconds', 'budget_reserved: waiting 15.0s'),
    'deferred', 'past the bound, a claim that reported no 429 is deferred');
SELECT is(pg_temp.counts(:'two'), ('queued', 1, 24, 0)::text, 'its attempt given back, the count unchanged');
UPDATE runrow.agent_run SET not_before = NULL WHERE id = :'two';
SELECT pg_temp.claim(:'two');
-- The agent's own deferral past 5 in one attempt is the cap's, which defers its first 3.
SELECT runrow.report_rate_limited(:'two', pg_temp.token(:'two'), 60) FROM generate_series(1, 6);
SELECT is(runrow.defer_run(:'two', pg_temp.token(:'two'), interval '60 seconds', '429_cap: 6 in one attempt: HTTP 429'),
    'deferred', 'past the bound, a deferral the cap counts is the cap''s: deferred');
SELECT is(pg_temp.counts(:'two'), ('queued', 1, 30, 1)::text, 'and counted against the cap');
UPDATE runrow.agent_run SET not_before = NULL WHERE id = :'two';
SELECT pg_temp.block_over('k-two');
SELECT pg_temp.claim(:'two');
SELECT is(pg_temp.blocked_claim(:'two'), 'dead', 'the next 429 without an answer spends the last attempt: dead');
SELECT is(pg_temp.counts(:'two'), ('dead', 2, 31, 1)::text, 'dead on its second attempt');

-- An answered model call in between starts the count again: append_step's usage, record_usage's.
SELECT pg_temp.keyed('k-answered', 1) AS three \gset
SELECT is(pg_temp.blocked_claims(:'three', 20), 'deferred', '20 claims of one 429 each');
SELECT pg_temp.answered(:'three');
SELECT is(pg_temp.counts(:'three'), ('running', 1, 0, 0)::text, 'a model turn stored with its usage: 0 again');
SELECT is(pg_temp.blocked_claims(:'three', 23), 'deferred', '23 more since the answer: deferred');
SELECT ok(runrow.record_usage(:'three', pg_temp.token(:'three'), '{"input_tokens": 3, "output_tokens": 0}'),
    'a usage settled without a step');
SELECT is(pg_temp.counts(:'three'), ('running', 1, 0, 0)::text, 'record_usage: 0 again too');
SELECT is(pg_temp.blocked_claims(:'three', 24), 'failed at 24', 'and the 24th after it releases');

-- Fenced out: a wrong token counts nothing and defers nothing, at the bound too.
SELECT pg_temp.keyed('k-fenced', 1) AS four \gset
SELECT is(pg_temp.blocked_claims(:'four', 23), 'deferred', '23 claims');
SELECT runrow.report_rate_limited(:'four', pg_temp.token(:'four'), 60);
SELECT pg_temp.fingerprint() AS before \gset
SELECT runrow.report_rate_limited(:'four', gen_random_uuid(), 60);
SELECT is(runrow.defer_run(:'four', gen_random_uuid(), interval '60 seconds', 'blocked: waiting 60.0s'), NULL,
    'defer_run with a wrong token at the bound: NULL');
SELECT is(pg_temp.fingerprint(), :'before', 'a wrong token reports nothing and releases nothing');

-- Bad input at the bound: refused as before, nothing written.
SELECT throws_ok(
    format('SELECT runrow.defer_run(%L, %L, interval ''60 seconds'', NULL)', :'four', pg_temp.token(:'four')),
    '22004', NULL, 'a NULL reason at the bound: 22004');
SELECT throws_ok(
    format('SELECT runrow.defer_run(%L, %L, interval ''60 seconds'', '' '')', :'four', pg_temp.token(:'four')),
    '22023', NULL, 'a reason of white space at the bound: 22023');
SELECT throws_ok(
    format('SELECT runrow.report_rate_limited(%L, %L, 0)', :'four', pg_temp.token(:'four')),
    '22023', NULL, 'report_rate_limited with no wait: 22023');
SELECT is(pg_temp.fingerprint(), :'before', 'bad input writes nothing, counts nothing');

SELECT * FROM finish();
ROLLBACK;
