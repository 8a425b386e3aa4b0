-- The one question a key error's 403 rules ask (migration 0107): is there another run of the key
-- that could answer the key's probe? Private: not granted to any role, no SET clauses (runs under
-- its callers' search_path, as functions/_limits_helpers.sql).
--
-- Another run of l's key, in another conversation (a turn of the run's own conversation waits
-- behind the run), that is running, or (unless running_only) queued, not behind a turn of its own
-- conversation (claim_blocked) and due within 15 s of the key error's hold's end (now, when it is
-- over: acquire_model_call; the probe's hold, for the runs deferred to it: report_key_error), and
-- not itself refused with a 403 since the key's last answer (its probe tells nothing such a run's
-- own would not). acquire_model_call leaves the probe to such a run (probe_elsewhere);
-- report_key_error's lone-run rule fails a run with none. Asked the same way by both, else a run
-- one counts and the other ignores was neither the probe's alternative nor let fail (the review:
-- a conversation's next turn held its run for ever, two refused runs each waited for the other).
-- The hold is key_error_until, not blocked_until (migration 0110): that is the longer of the hold
-- and a 429 block on the key (up to a day), and a run deferred to a day-long 429 block's end
-- counted as able to answer the probe now. running_only (0110): the probe was forced past
-- acquire_model_call's bound (rate_limit.key_probe_forced), so the queued runs it would have been
-- left to are ones the claim did not hand out in time (a paused concurrency key): counted, the
-- refused run was refused every block for ever. refused (0110) asks the other question of the
-- same runs: is there another one that was refused with a 403 since the key's last answer (the
-- refusal shared by several requests: report_key_error then waits longer before failing).
-- Each arm implies the predicate of a partial index of open runs (running:
-- agent_run_one_active_per_conversation; queued and claimable: agent_run_claimable; queued and
-- delayed: agent_run_delayed): no index has rate_limit_key, and one test of status across two of
-- them left the planner a seq scan of the whole history (issue 11). PL/pgSQL: its columns
-- (key_error_refused, migration 0099) are resolved when it runs, not on an older schema.
CREATE OR REPLACE FUNCTION runrow._key_has_other_answerer(
    l runrow.rate_limit, run_id uuid, conversation_id uuid, running_only boolean, refused boolean
)
RETURNS boolean
LANGUAGE plpgsql
STABLE
AS $fn$
DECLARE
    due_by timestamptz := greatest(l.key_error_until, now()) + interval '15 seconds';
BEGIN
    RETURN EXISTS (
        SELECT 1
        FROM (
            SELECT o.id, o.conversation_id, o.rate_limit_key, o.key_error_refused, o.key_error_answers
            FROM runrow.agent_run AS o WHERE o.status = 'running'
            UNION ALL
            SELECT o.id, o.conversation_id, o.rate_limit_key, o.key_error_refused, o.key_error_answers
            FROM runrow.agent_run AS o
            WHERE o.status = 'queued' AND NOT o.claim_blocked AND o.not_before IS NULL
              AND NOT _key_has_other_answerer.running_only
            UNION ALL
            SELECT o.id, o.conversation_id, o.rate_limit_key, o.key_error_refused, o.key_error_answers
            FROM runrow.agent_run AS o
            WHERE o.status = 'queued' AND NOT o.claim_blocked AND o.not_before <= due_by
              AND NOT _key_has_other_answerer.running_only
        ) AS o
        WHERE o.rate_limit_key = l.rate_limit_key
          AND o.id <> _key_has_other_answerer.run_id
          AND o.conversation_id <> _key_has_other_answerer.conversation_id
          AND (o.key_error_refused IS NOT NULL AND o.key_error_answers IS NOT DISTINCT FROM l.key_answers)
              = _key_has_other_answerer.refused
    );
END
$fn$;

REVOKE ALL ON FUNCTION runrow._key_has_other_answerer(runrow.rate_limit, uuid, uuid, boolean, boolean) FROM PUBLIC;
