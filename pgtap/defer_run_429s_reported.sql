-- defer_run's cap on deferrals for 429s counts the 429s the database heard, not the reason's
-- text (migration 0106). 0103 counted only a reason beginning 429_cap: a worker that deferred
-- after a run of 429s with any other reason was never capped (the SQL review of 0103, F5). Now
-- report_rate_limited counts the 429s of the current claim (agent_run.reported_429s, fenced by
-- the claim token), and a deferral after more than 5 of them (the agent's MAX_429_IN_ATTEMPT:
-- tests/test_defer_run_429s_reported.py holds them equal) counts against the cap too, whatever
-- its reason. A reason beginning 429_cap still counts as before.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/deferrals.psql
SELECT plan(17);
SELECT pg_temp.drain_queue();

CREATE FUNCTION pg_temp.report_429s(run uuid, n int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..n LOOP
        PERFORM runrow.report_rate_limited(run, pg_temp.token(run), 0.01);
    END LOOP;
    -- The block each 429 set is over (the clock does not move in a transaction): the run is
    -- claimable again once due.
    UPDATE runrow.rate_limit SET blocked_until = NULL;
END $$;
-- n 429s reported, then a deferral with a reason that does not name the cap, then the run due
-- and claimed again (the queue is otherwise empty).
CREATE FUNCTION pg_temp.defer_after(run uuid, n int) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_temp.report_429s(run, n);
    RETURN pg_temp.defer_and_reclaim(run, 'rate_limited: waiting 1.0s');
END $$;

SELECT pg_temp.running() AS one \gset
SELECT pg_temp.report_429s(:'one', 3);
SELECT is((SELECT reported_429s FROM runrow.agent_run WHERE id = :'one'), 3::smallint,
    'report_rate_limited counts the claim''s 429s');
SELECT pg_temp.fingerprint() AS before \gset
SELECT runrow.report_rate_limited(:'one', gen_random_uuid(), 0.01);
SELECT is(pg_temp.fingerprint(), :'before', 'a wrong token counts nothing, writes nothing');
SELECT is(runrow.defer_run(:'one', pg_temp.token(:'one'), interval '1 minute', 'rate_limited: waiting 1.0s'),
    'deferred', '5 or fewer 429s, then a deferral');
SELECT is(pg_temp.capped(:'one'), 0::smallint, 'is not counted against the cap');
UPDATE runrow.agent_run SET not_before = now() WHERE id = :'one';
SELECT pg_temp.claim(:'one');
SELECT pg_temp.report_429s(:'one', 1);
SELECT is((SELECT reported_429s FROM runrow.agent_run WHERE id = :'one'), 1::smallint,
    'a new claim counts its own 429s from 1');
SELECT is(pg_temp.defer_after(:'one', 4), 'deferred', '5 in one claim, then a deferral');
SELECT is(pg_temp.capped(:'one'), 0::smallint, 'is not counted: 5 is the agent''s own allowance');

-- More than 5: counted whatever the reason, and the 4th such deferral spends the attempt.
SELECT is(pg_temp.defer_after(:'one', 6), 'deferred', '6 429s then a deferral with another reason defers');
SELECT is(pg_temp.capped(:'one'), 1::smallint, 'and is counted against the cap');
SELECT is(pg_temp.defer_after(:'one', 0), 'deferred', 'a deferral of the next claim, with no 429s of its own');
SELECT is(pg_temp.capped(:'one'), 1::smallint, 'is not counted: the earlier claim''s 429s are not its');
SELECT is(pg_temp.defer_after(:'one', 7), 'deferred', 'the second');
SELECT is(pg_temp.defer_after(:'one', 6), 'deferred', 'the third');
SELECT is(pg_temp.defer_after(:'one', 6), 'failed', 'the 4th, on the run''s last attempt, fails it');
SELECT is((SELECT (status, attempt, cap_429_deferrals)::text FROM runrow.agent_run WHERE id = :'one'),
    ('failed', 1, 3)::text, 'its attempt spent, 3 deferrals counted');

-- A 429_cap reason after 6 429s (the agent's deferral) counts once.
SELECT pg_temp.running() AS two \gset
SELECT pg_temp.report_429s(:'two', 6);
SELECT is(runrow.defer_run(:'two', pg_temp.token(:'two'), interval '1 minute', '429_cap: 6 in one attempt: HTTP 429'),
    'deferred', 'the agent''s 429_cap deferral');
SELECT is(pg_temp.capped(:'two'), 1::smallint, 'counts once');

SELECT * FROM finish();
ROLLBACK;
