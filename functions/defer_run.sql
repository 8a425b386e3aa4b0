CREATE OR REPLACE FUNCTION runrow.defer_run(run_id uuid, claim_token uuid, retry_in interval, reason text)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    r runrow.agent_run;
    last_seq bigint;
    key text;
    told timestamptz;
    key_block timestamptz;
    block_end timestamptz;
    events jsonb;
    taken_back jsonb;
    -- A deferral for 429s past the attempt's cap: at most this many a run
    -- (agent_run.cap_429_deferrals); the next spends the attempt.
    max_cap_deferrals constant smallint := 3;
    -- The agent's allowance of 429s in one attempt (pyworker/agent/limits.py MAX_429_IN_ATTEMPT,
    -- held equal by tests/test_defer_run_429s_reported.py): a deferral of a claim that reported
    -- more is one for 429s, whatever its reason says (migration 0106).
    max_429_in_attempt constant smallint := 5;
    -- The run's 429s without an answer between (agent_run.unanswered_429s, migration 0109), at
    -- most (max_429_in_attempt + 1) x (max_cap_deferrals + 1): what the cap above lets a limit
    -- that never clears cost. A run deferred each time after one 429 (a retry-after longer than
    -- the worker waits in place: deferred as blocked) never met that cap.
    max_unanswered_429s constant smallint := (max_429_in_attempt + 1) * (max_cap_deferrals + 1);
    for_cap boolean;
    cap_deferrals smallint;
    unanswered smallint;
    -- Whether this claim reported a 429 (report_rate_limited).
    claim_429 boolean;
    -- Why the deferral is a release instead (past the cap or the bound), or NULL.
    released text;
BEGIN
    PERFORM runrow._require_not_null(defer_run.run_id, 'run_id');
    PERFORM runrow._require_not_null(defer_run.claim_token, 'claim_token');
    PERFORM runrow._require_not_null(defer_run.retry_in, 'retry_in');
    PERFORM runrow._require_not_null(defer_run.reason, 'reason');
    IF NOT runrow._delay_plain(defer_run.retry_in, interval '1 day') THEN
        PERFORM runrow._require_delay(defer_run.retry_in, 'retry_in', interval '1 day');
    END IF;
    IF btrim(defer_run.reason, runrow._white_space()) = '' OR length(defer_run.reason) > 10000 THEN
        RAISE EXCEPTION 'reason must be 1 to 10000 characters, not only white space'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF NOT runrow._hold_claim(defer_run.run_id, defer_run.claim_token) THEN
        RETURN NULL;  -- fenced out: nothing written
    END IF;
    -- A deferral past the end of a block of the run's key in force ends with the block. The
    -- worker's retry_in is the wait acquire_model_call or report_key_error told it, counted
    -- from that transaction's now(), so now() + retry_in fell just past the block's end, and a
    -- block that ended early (the key error's probe answered: _key_answered; set_rate_limit
    -- removed the limit) lifts only the runs held to its very end (_lift_held_runs): a deferred
    -- run waited out one more block, up to 300 s, with the key working (the model-calls
    -- audit). Read under a share lock: a probe's answer ending the block (it holds the row's
    -- lock) waits for this deferral and then finds the run held to the block's end.
    SELECT
        a.rate_limit_key,
        a.block_told_until,
        a.cap_429_deferrals,
        a.unanswered_429s,
        coalesce(a.reported_429s_claim = defer_run.claim_token, false),
        starts_with(defer_run.reason, '429_cap')
        OR coalesce(a.reported_429s_claim = defer_run.claim_token AND a.reported_429s > max_429_in_attempt, false)
    INTO key, told, cap_deferrals, unanswered, claim_429, for_cap
    FROM runrow.agent_run AS a WHERE a.id = defer_run.run_id;
    -- The cap on deferrals for 429s is the run's, not the worker's: each came after a run of
    -- 429s that blocked the key for the whole fleet, and a worker that counts them wrong (or
    -- not at all: examples/node) deferred for ever. Past it the run is released instead, its
    -- attempt spent (release_run's ending: failed on a run's last attempt, the default), so
    -- max_attempts bounds a 429 that never clears.
    --
    -- The cap counts none of a claim's first 5 429s: a retry-after longer than the worker waits
    -- in place (deferred as blocked after one 429) was deferred for ever, each claim blocking
    -- the key again (migration 0109). So the run's 429s without an answer are bounded too: a
    -- deferral after a 429 of its claim, the run's 24th since its last answer or later, is
    -- released the same way whatever its reason. One the cap counts is bounded by the cap (its
    -- first 3 are deferred, as before), and one that follows no 429 of its claim (a wait for
    -- the key's limits or a budget) blocked no one, and is deferred.
    released := CASE
        WHEN for_cap AND cap_deferrals >= max_cap_deferrals
            THEN format('after %s deferrals for 429s, the most defer_run gives a run', cap_deferrals)
        WHEN NOT for_cap AND claim_429 AND unanswered >= max_unanswered_429s
            THEN format('after %s 429s without an answer, the most a run is deferred for', unanswered)
    END;
    IF released IS NOT NULL THEN
        RETURN runrow._end_claim(
            defer_run.run_id, defer_run.claim_token,
            format('%s (%s: its attempt spent)', left(defer_run.reason, 9900), released),
            NULL, defer_run.retry_in
        );
    END IF;
    -- Only a block in force is locked (and read): a rate_limited deferral (frequent under a
    -- tight limit) must not queue the key's grants behind it (the review). IS TRUE: a test of
    -- the key's row, not a range of rate_limit_blocked (migration 0114), which the planner took
    -- with the key as a filter: every key blocked now was read (202 in a storm of 202).
    SELECT l.blocked_until INTO key_block
    FROM runrow.rate_limit AS l WHERE l.rate_limit_key = key AND (l.blocked_until > now()) IS TRUE
    FOR SHARE;
    block_end := CASE
        WHEN key_block IS NOT NULL THEN key_block
        -- No block in force, yet the one this run was told to wait for had not ended: it was
        -- lifted after it was told and before this deferral, and the lift ran before the run
        -- was queued, so it is due now (CI's test_deferred_runs_go_as_soon_as_the_key_works
        -- met it: one block late).
        WHEN told > now() THEN now()
    END;

    -- release_run's hand-back, but the attempt is given back, as parking gives it back: a wait
    -- for a fleet limit is not the run failing. release_run spent it, so a run on its last
    -- attempt (every max_attempts = 1 run) that had to wait out a rate limit ended failed.
    -- A stop requested meanwhile wins, as in release_run.
    UPDATE runrow.agent_run AS a
    SET status = CASE WHEN a.cancel_requested THEN 'cancelled' ELSE 'queued' END,
        attempt = CASE WHEN a.cancel_requested THEN a.attempt ELSE a.attempt - 1 END,
        finished_at = CASE WHEN a.cancel_requested THEN now() END,
        error = defer_run.reason,
        claim_token = NULL,
        claim_expires_at = NULL,
        not_before = CASE WHEN NOT a.cancel_requested THEN least(now() + defer_run.retry_in, block_end) END,
        -- A deferral follows a call refused (a key error) or never granted: nothing to charge
        -- if a later holder of this attempt number dies (its attempt is given back).
        model_call_reserved = NULL,
        model_call_attempt = NULL,
        block_told_until = NULL,
        cap_429_deferrals = a.cap_429_deferrals + CASE WHEN for_cap AND NOT a.cancel_requested THEN 1 ELSE 0 END,
        updated_at = now()
    WHERE a.id = defer_run.run_id
    RETURNING a.* INTO r;
    -- Out of its tenant's reserved total too (migration 0088), after the key's row as a grant.
    PERFORM runrow._tenant_unreserve(defer_run.run_id);

    IF r.status = 'cancelled' THEN
        PERFORM runrow._journal_complete(r.id, r.conversation_id, r.status, NULL, defer_run.reason);
        RETURN 'cancelled';
    END IF;
    events := jsonb_build_array(jsonb_build_object(
        'type', 'run_requeued', 'attempt', r.attempt, 'max_attempts', r.max_attempts,
        'error', defer_run.reason, 'not_before', r.not_before, 'deferred', true));
    -- The next claim has this claim's attempt number, and a resumed attempt 1 takes nothing
    -- back: what this claim streamed and did not commit (a turn cut off by a key error
    -- mid-stream) is taken back here (functions/_supersede.sql).
    taken_back := runrow._superseded_event(r.id, r.attempt + 1);
    IF taken_back IS NOT NULL THEN
        events := jsonb_build_array(taken_back) || events;
    END IF;
    last_seq := runrow._journal(r.id, events);
    PERFORM runrow._wake_tails(r.id, last_seq);
    IF r.not_before <= now() THEN
        -- Due at once (its block was lifted): the dispatchers the lift woke did not see it.
        PERFORM runrow._wake_dispatchers(r.conversation_id);
    END IF;
    RETURN 'deferred';
END
$fn$;

COMMENT ON FUNCTION runrow.defer_run(uuid, uuid, interval, text) IS
'A worker hands back a run that must wait for a fleet limit (a rate-limited or blocked '
'rate_limit_key, as acquire_model_call said), without spending an attempt: queued again with its '
'attempt given back, not claimable before now() + retry_in (more than 0, at most 1 day, judged where it lands), or '
'before the end of a block of its rate_limit_key in force when that comes first (so a block '
'that ends early, its key error''s probe answered or its limit removed, makes it due at once '
'with the runs the claim held to the block''s end), or now when the block its holder was told to '
'wait for (block_told_until, kept by acquire_model_call and report_key_error) has been lifted or '
'cut short since; reason '
'kept as its error and journaled in run_requeued (with not_before and deferred = true), after a '
'superseded event for the next claim (which has this attempt number) when this claim streamed '
'deltas after the work it committed (_superseded_event); the '
'dispatchers are woken only when it is due at once. A deferral for 429s (a reason beginning '
'429_cap, the agent''s, or whatever the reason a claim that reported more than 5 429s through '
'report_rate_limited: agent_run.reported_429s) is counted in agent_run.cap_429_deferrals, at most '
'3 a run whoever calls: a 4th is not deferred but released as release_run releases, its attempt '
'spent (requeued for retry_in with attempts left; failed, or dead, on its last attempt: the '
'default max_attempts 1 fails), error the reason followed by (after 3 deferrals for 429s, ...). '
'So is any other deferral of a claim that reported a 429 once the run has reported 24 '
'(report_rate_limited) since its last answered model call (agent_run.unanswered_429s; 24 = '
'(5 + 1) x (3 + 1), what the cap above lets a 429 that never clears cost), whatever its reason, '
'error the reason followed by (after N 429s without an answer, ...): a retry-after longer than '
'the worker waits in place, deferred after one 429 each claim, is bounded too. '
'Fenced by claim_token and status running. Returns deferred, or cancelled (a stop was '
'pending; complete journaled), or past either 429 bound requeued, failed, dead or cancelled, or NULL '
'when fenced out (nothing written, nothing counted). Bad input (a NULL '
'argument, retry_in out of range, a reason empty, of white space only or over 10000 characters) '
'raises 22004/22023 naming it and writes nothing.';

REVOKE ALL ON FUNCTION runrow.defer_run(uuid, uuid, interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.defer_run(uuid, uuid, interval, text) TO runrow_worker;
