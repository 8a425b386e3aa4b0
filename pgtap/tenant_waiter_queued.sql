-- A tenant's waiter keeps its place while its run is queued (migration 0097). The worker defers
-- a run told budget_reserved for 15 s; then it waits for a free slot. Before 0097 the waiter was
-- forgotten a minute after its last ask, wherever its run was: a saturated fleet that took more
-- than 45 s past the deferral to claim it again dropped it, and smaller calls took the room once
-- more (the large-call starvation the waiter was built to stop). Now a queued waiter is kept
-- until its run has been due for five minutes (due at most a minute after its last ask: migration
-- 0099); a held one still asks within the minute. The
-- transaction's now() does not move: the test moves the columns (waiter_seen_at, not_before).
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(17);
SELECT pg_temp.drain_queue();

SELECT runrow.set_model_price('wq-model', 3, 15, 3.75, 0.3);
SELECT runrow.set_tenant_budget('wq-tenant', 91000, NULL);

-- A run of the tenant claimed: a grant with the estimate 300 reserves 300 + max_tokens.
CREATE FUNCTION pg_temp.held_run(max_tokens int DEFAULT 1000) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE run uuid;
BEGIN
    SELECT e.run_id INTO run FROM runrow.enqueue_run(
        conversation_id => gen_random_uuid(), content => '"hi"', model => 'wq-model', user_id => 'wq-tenant',
        metadata => jsonb_build_object('max_tokens', max_tokens), max_attempts => 3) AS e;
    PERFORM pg_temp.claim(run);
    RETURN run;
END $$;
CREATE FUNCTION pg_temp.acquire(run uuid) RETURNS text LANGUAGE sql AS $$
    SELECT (a.granted, a.wait_seconds, a.reason)::text
    FROM runrow.acquire_model_call(run, pg_temp.token(run), 300) AS a
$$;
CREATE FUNCTION pg_temp.waiter() RETURNS uuid LANGUAGE sql AS $$
    SELECT waiter_run FROM runrow.tenant_budget WHERE fairness_key = 'wq-tenant'
$$;
-- The waiter's last ask `seen` ago, its run due at `due` (NULL: a claim promoted it).
CREATE FUNCTION pg_temp.age(run uuid, seen interval, due timestamptz) RETURNS void LANGUAGE sql AS $$
    UPDATE runrow.tenant_budget SET waiter_seen_at = now() - seen WHERE fairness_key = 'wq-tenant';
    UPDATE runrow.agent_run SET not_before = due WHERE id = run;
$$;

-- The large call (90300) does not fit beside a small one in flight (1300; budget 91000): it is
-- the waiter, and its worker defers the run as it always does for budget_reserved.
SELECT pg_temp.held_run(90000) AS big \gset
SELECT pg_temp.held_run() AS s1 \gset
-- The calls that come later, claimed now: the waiter's run, once due, would be the next claimed.
SELECT pg_temp.held_run() AS s2 \gset
SELECT pg_temp.held_run(90000) AS s3 \gset
SELECT pg_temp.held_run(90000) AS s4 \gset
SELECT pg_temp.held_run() AS s5 \gset
SELECT is(pg_temp.acquire(:'s1'), '(t,0,)', 'a small call is granted');
SELECT is(pg_temp.acquire(:'big'), '(f,15,budget_reserved)', 'the large one waits');
SELECT is(runrow.defer_run(:'big', pg_temp.token(:'big'), interval '15 seconds', 'budget_reserved: waiting 15.0s'),
    'deferred', 'its worker defers it');
SELECT is(pg_temp.waiter(), :'big'::uuid, 'queued, it is the tenant''s waiter');

-- Saturation: due 75 s ago (asked 90 s ago), not claimed yet, no claim has promoted it.
SELECT pg_temp.age(:'big', interval '90 seconds', now() - interval '75 seconds');
SELECT is(pg_temp.acquire(:'s2'), '(f,15,budget_reserved)',
    'due 75 s ago and still queued, it keeps its place: a small call that fits only without it waits');
SELECT is(pg_temp.waiter(), :'big'::uuid, 'the queued run is still the waiter');

-- Promoted by a claim (not_before cleared) and waiting for a slot, its last ask 4 min ago.
SELECT pg_temp.age(:'big', interval '4 minutes', NULL);
SELECT is(pg_temp.acquire(:'s2'), '(f,15,budget_reserved)', 'due and waiting for a slot, it keeps its place');
SELECT is(pg_temp.waiter(), :'big'::uuid, 'still the waiter');

-- Deferred again by a rate limit (not_before ahead) after its last budget ask 90 s ago: due
-- counts from at most a minute after the ask, 30 s ago.
SELECT pg_temp.age(:'big', interval '90 seconds', now() + interval '30 seconds');
SELECT is(pg_temp.acquire(:'s2'), '(f,15,budget_reserved)', 'deferred again and not yet due: it keeps its place');

-- The bound: due for more than five minutes and never claimed (a low priority under constant
-- load), it holds the tenant's room no longer.
SELECT pg_temp.age(:'big', interval '6 minutes', NULL);
SELECT is(pg_temp.acquire(:'s2'), '(t,0,)', 'queued and due for over five minutes: forgotten, the small call goes');
SELECT is(pg_temp.waiter(), NULL, 'nobody waits');

-- A held waiter still asks within the minute: silent for two, it is forgotten.
SELECT is(pg_temp.acquire(:'s3'), '(f,15,budget_reserved)', 's3 does not fit beside s1 and s2: it is the waiter');
SELECT pg_temp.age(:'s3', interval '2 minutes', NULL);
SELECT pg_temp.acquire(:'s4');
SELECT is(pg_temp.waiter(), :'s4'::uuid, 'a held waiter silent for two minutes is forgotten: the next to wait is it');

-- A waiter deferred far (a 429's retry-after, a claim holding it to its key's block: 3 h) kept
-- the tenant's room for those hours before migration 0099, nothing in flight: due counts as at
-- most a minute after its last ask, so it holds the room six minutes past the ask at most.
SELECT is(runrow.defer_run(:'s4', pg_temp.token(:'s4'), interval '3 hours', 'rate_limited: retry-after 10800'),
    'deferred', 'the waiter is deferred for three hours');
SELECT pg_temp.age(:'s4', interval '2 minutes', now() + interval '3 hours');
SELECT is(pg_temp.acquire(:'s5'), '(f,15,budget_reserved)',
    'asked two minutes ago: it keeps its place, a small call that fits only without it waits');
SELECT pg_temp.age(:'s4', interval '7 minutes', now() + interval '3 hours');
SELECT is(pg_temp.acquire(:'s5'), '(t,0,)',
    'asked seven minutes ago, due in three hours: forgotten, the small call goes');
SELECT is(pg_temp.waiter(), NULL, 'nobody waits');

SELECT * FROM finish();
ROLLBACK;
