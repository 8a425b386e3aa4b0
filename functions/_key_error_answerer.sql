-- The one question a key error's 403 rules ask (migration 0107): is there another run of the key
-- that could answer the key's probe? Private: not granted to any role, no SET clauses (runs under
-- its callers' search_path, as functions/_limits_helpers.sql).
--
-- Another run of l's key, in another conversation (a turn of the run's own conversation waits
-- behind the run), that is running, or queued, not behind a turn of its own conversation
-- (claim_blocked) and due within 15 s of the key's block's end (now, when the block is over:
-- acquire_model_call; the probe's hold, for the runs deferred to it: report_key_error), and not
-- itself refused with a 403 since the key's last answer (its probe tells nothing such a run's own
-- would not). acquire_model_call leaves the probe to such a run (probe_elsewhere);
-- report_key_error's lone-run rule fails a run with none. Asked the same way by both, else a run
-- one counts and the other ignores was neither the probe's alternative nor let fail (the review:
-- a conversation's next turn held its run for ever, two refused runs each waited for the other).
-- Each arm implies the predicate of a partial index of open runs (running:
-- agent_run_one_active_per_conversation; queued and claimable: agent_run_claimable; queued and
-- delayed: agent_run_delayed): no index has rate_limit_key, and one test of status across two of
-- them left the planner a seq scan of the whole history (issue 11). PL/pgSQL: its columns
-- (key_error_refused, migration 0099) are resolved when it runs, not on an older schema.
CREATE OR REPLACE FUNCTION runrow._key_has_other_answerer(l runrow.rate_limit, run_id uuid, conversation_id uuid)
RETURNS boolean
LANGUAGE plpgsql
STABLE
AS $fn$
DECLARE
    due_by timestamptz := greatest(l.blocked_until, now()) + interval '15 seconds';
BEGIN
    RETURN EXISTS (
        SELECT 1
        FROM (
            SELECT o.id, o.conversation_id, o.rate_limit_key, o.key_error_refused, o.key_error_answers
            FROM runrow.agent_run AS o WHERE o.status = 'running'
            UNION ALL
            SELECT o.id, o.conversation_id, o.rate_limit_key, o.key_error_refused, o.key_error_answers
            FROM runrow.agent_run AS o WHERE o.status = 'queued' AND NOT o.claim_blocked AND o.not_before IS NULL
            UNION ALL
            SELECT o.id, o.conversation_id, o.rate_limit_key, o.key_error_refused, o.key_error_answers
            FROM runrow.agent_run AS o
            WHERE o.status = 'queued' AND NOT o.claim_blocked AND o.not_before <= due_by
        ) AS o
        WHERE o.rate_limit_key = l.rate_limit_key
          AND o.id <> _key_has_other_answerer.run_id
          AND o.conversation_id <> _key_has_other_answerer.conversation_id
          AND (o.key_error_refused IS NULL OR o.key_error_answers IS DISTINCT FROM l.key_answers)
    );
END
$fn$;

REVOKE ALL ON FUNCTION runrow._key_has_other_answerer(runrow.rate_limit, uuid, uuid) FROM PUBLIC;
