-- runrow.defer_run's cap on deferrals for 429s (migration 0103): a reason beginning 429_cap is
-- counted in agent_run.cap_429_deferrals, and past 3 such deferrals the run is released, its
-- attempt spent, whoever the worker is. The cap lived only in the Python agent, which counted
-- its journal: another worker (examples/node), or a bug, deferred for ever.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/deferrals.psql
SELECT plan(22);
SELECT pg_temp.drain_queue();

-- A 429_cap deferral, then the run due and claimed again.
CREATE FUNCTION pg_temp.cap_defer(run uuid) RETURNS text LANGUAGE sql AS $$
    SELECT pg_temp.defer_and_reclaim(run, '429_cap: 6 in one attempt: HTTP 429')
$$;

-- Happy path: three deferrals, each counted, the attempt given back each time.
SELECT pg_temp.running() AS one \gset
SELECT is(pg_temp.capped(:'one'), 0::smallint, 'a new run has no deferral for 429s');
SELECT is(pg_temp.cap_defer(:'one'), 'deferred', 'the first 429_cap deferral defers');
SELECT is(pg_temp.capped(:'one'), 1::smallint, 'and is counted');
SELECT is(runrow.defer_run(:'one', pg_temp.token(:'one'), interval '1 minute', 'rate_limited: waiting 60.0s'),
    'deferred', 'another deferral (a bucket''s wait) defers');
UPDATE runrow.agent_run SET not_before = now() WHERE id = :'one';
SELECT pg_temp.claim(:'one');
SELECT is(pg_temp.capped(:'one'), 1::smallint, 'and is not counted');
SELECT is(pg_temp.cap_defer(:'one'), 'deferred', 'the second defers');
SELECT is(pg_temp.cap_defer(:'one'), 'deferred', 'the third defers');
SELECT is((SELECT (status, attempt, cap_429_deferrals)::text FROM runrow.agent_run WHERE id = :'one'),
    ('running', 1, 3)::text, 'running on attempt 1 of 1 again, 3 deferrals counted');
SELECT is(pg_temp.count_events(:'one', 'run_requeued'), 4, 'four deferrals journaled');

-- The fourth: released as release_run releases, its attempt spent; on its one attempt, failed.
SELECT is(pg_temp.cap_defer(:'one'), 'failed', 'the 4th 429_cap deferral fails a run on its last attempt');
SELECT is((SELECT (status, attempt, claim_token, not_before, cap_429_deferrals)::text
           FROM runrow.agent_run WHERE id = :'one'),
    ('failed', 1, NULL::uuid, NULL::timestamptz, 3)::text, 'failed, its attempt spent, the count unchanged');
SELECT is((SELECT error FROM runrow.agent_run WHERE id = :'one'),
    '429_cap: 6 in one attempt: HTTP 429 (after 3 deferrals for 429s, the most defer_run gives a run: its attempt spent)',
    'the error keeps the reason and names the cap');
SELECT is(pg_temp.last_event(:'one') ->> 'type', 'complete', 'complete journaled');
SELECT is(pg_temp.last_event(:'one') ->> 'status', 'failed', 'as failed');

-- With attempts left, the 4th is requeued on the next attempt after retry_in, not deferred.
SELECT pg_temp.running(attempts => 2) AS two \gset
SELECT pg_temp.cap_defer(:'two'), pg_temp.cap_defer(:'two'), pg_temp.cap_defer(:'two');
SELECT is(pg_temp.cap_defer(:'two'), 'requeued', 'with an attempt left the 4th is requeued');
SELECT is((SELECT (status, attempt, not_before)::text FROM runrow.agent_run WHERE id = :'two'),
    ('queued', 1, now() + interval '1 minute')::text, 'its attempt spent, claimable after retry_in');
SELECT is(pg_temp.last_event(:'two') - 'error',
    jsonb_build_object('type', 'run_requeued', 'attempt', 1, 'max_attempts', 2,
        'not_before', now() + interval '1 minute'),
    'run_requeued journaled without deferred');
SELECT runrow.cancel_run(:'two');

-- Fenced out: a wrong token counts nothing and writes nothing, at the cap too.
SELECT pg_temp.running(attempts => 2) AS fenced \gset
SELECT pg_temp.cap_defer(:'fenced'), pg_temp.cap_defer(:'fenced'), pg_temp.cap_defer(:'fenced');
SELECT pg_temp.fingerprint() AS before \gset
SELECT is(runrow.defer_run(:'fenced', gen_random_uuid(), interval '1 minute', '429_cap: 6 in one attempt'), NULL,
    'a wrong token at the cap: NULL');
SELECT is(pg_temp.fingerprint(), :'before', 'and nothing written');
SELECT is(pg_temp.capped(:'fenced'), 3::smallint, 'nothing counted');

-- Bad input at the cap: the argument named, nothing written, the run not ended.
SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok(format('SELECT runrow.defer_run(%L, %L, %L, %L)', :'fenced', pg_temp.token(:'fenced'), '2 days',
    '429_cap: 6 in one attempt'),
    '22023', 'retry_in must be NULL or more than 0 and at most 1 day, got 2 days', 'retry_in over a day');
SELECT is(pg_temp.fingerprint(), :'before', 'bad input at the cap wrote nothing');

SELECT * FROM finish();
ROLLBACK;
