-- The DBA's health check: one row per broken invariant, zero rows when healthy.
--
-- Cost model (why each check reads what it reads): everything an audit looks at is either
-- the live set (queued, running, waiting runs, open tool effects: bounded by capacity, not
-- by history, and each served by a partial index) or a window of recent history
-- (history_window, served by agent_run_finished), or an index that is empty on a
-- healthy database (agent_run_terminal_anomaly). The only history-sized work is the journal
-- and step pass (seq gaps, complete events), which walks the (run_id, seq) primary keys of
-- run_event and agent_step for the runs in scope: proportional to the events and steps of
-- history_window. A DBA who passes a long window on purpose gets a full pass (measured:
-- about 3 s for 20 k finished runs with 4 events and 2 steps each; the default window reads
-- none of them and the whole call takes about 12 ms, planning included). The answer check
-- (journal_missing_result_text) also reads the payloads of completed runs' text deltas in
-- that pass: measured 0.7 s -> 0.85 s for a full pass over 20 k completed runs with four
-- text deltas each, and no change with the default window.
CREATE OR REPLACE FUNCTION runrow.audit(
    lease_grace interval DEFAULT '60 seconds',
    intent_age interval DEFAULT '10 minutes',
    approval_age interval DEFAULT '24 hours',
    queued_age interval DEFAULT '15 minutes',
    history_window interval DEFAULT '7 days'
)
RETURNS TABLE (invariant text, run_id uuid, detail text)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    arg record;
BEGIN
    FOR arg IN
        SELECT v.name, v.value
        FROM (VALUES ('lease_grace', audit.lease_grace), ('intent_age', audit.intent_age),
                     ('approval_age', audit.approval_age), ('queued_age', audit.queued_age),
                     ('history_window', audit.history_window)) AS v (name, value)
    LOOP
        IF arg.value IS NULL THEN
            RAISE EXCEPTION '% must not be NULL', arg.name USING ERRCODE = 'null_value_not_allowed';
        END IF;
        IF arg.value < interval '0' THEN
            RAISE EXCEPTION '% must not be negative, got %', arg.name, arg.value
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- An interval reaching before 4713 BC overflows timestamptz (22008, naming nothing):
        -- bad input, named as such, as trim_journal names its older_than.
        BEGIN
            -- Negative by the calendar though not by comparison ('-1 year 360 days' compares
            -- as 0, and reached 5 days into the future).
            IF now() - arg.value > now() THEN
                RAISE EXCEPTION '% must not be negative, got %', arg.name, arg.value
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
        EXCEPTION WHEN datetime_field_overflow THEN
            RAISE EXCEPTION '% is out of range, got %', arg.name, arg.value
                USING ERRCODE = 'invalid_parameter_value';
        END;
    END LOOP;

    -- Row-level states the CHECK constraints forbid. Live runs are few; terminal runs are
    -- read through agent_run_terminal_anomaly (a stray claim token or no finished_at, in
    -- all history: the index is empty when healthy and its predicate is repeated verbatim
    -- so the planner can prove it) and, for a stray lease (no index may cover the lease:
    -- heartbeats must stay HOT) or attempts over the cap, through history_window.
    RETURN QUERY
    WITH suspect AS (
        SELECT a.* FROM runrow.agent_run AS a WHERE a.status = 'queued'
        UNION
        SELECT a.* FROM runrow.agent_run AS a WHERE a.status IN ('running', 'waiting')
        UNION
        SELECT a.* FROM runrow.agent_run AS a
        WHERE a.status IN ('completed', 'failed', 'cancelled', 'dead')
          AND (a.claim_token IS NOT NULL OR a.finished_at IS NULL)
        UNION
        SELECT a.* FROM runrow.agent_run AS a
        WHERE a.finished_at >= now() - audit.history_window
          AND (a.claim_expires_at IS NOT NULL OR a.attempt > a.max_attempts)
          AND a.status IN ('completed', 'failed', 'cancelled', 'dead')
    )
    SELECT v.invariant, s.id, v.detail
    FROM suspect AS s
    CROSS JOIN LATERAL (
        SELECT s.status IN ('completed', 'failed', 'cancelled', 'dead') AS terminal,
               s.claim_token IS NOT NULL OR s.claim_expires_at IS NOT NULL AS holds_claim,
               -- Whether a token is set, never the token: the auditor may not read it
               -- (migration 0073), and this function runs as the owner.
               CASE WHEN s.claim_token IS NULL THEN 'none' ELSE 'set' END AS token
    ) AS k
    CROSS JOIN LATERAL (VALUES
        ('terminal_run_holds_claim', k.terminal AND k.holds_claim,
         format('%s run still holds a claim: token %s, lease until %s', s.status, k.token, s.claim_expires_at)),
        ('idle_run_holds_claim', s.status IN ('queued', 'waiting') AND k.holds_claim,
         format('%s run holds a claim: token %s, lease until %s', s.status, k.token, s.claim_expires_at)),
        ('running_without_claim',
         s.status = 'running' AND (s.claim_token IS NULL OR s.worker_id IS NULL OR s.claim_expires_at IS NULL),
         format('running run lacks a claim: token %s, worker %s, lease until %s',
                k.token, s.worker_id, s.claim_expires_at)),
        ('terminal_without_finished_at', k.terminal AND s.finished_at IS NULL,
         format('%s run has no finished_at', s.status)),
        ('live_run_has_finished_at', NOT k.terminal AND s.finished_at IS NOT NULL,
         format('%s run has finished_at %s', s.status, s.finished_at)),
        ('attempt_out_of_range',
         s.attempt > s.max_attempts OR s.attempt < 0 OR (s.status = 'running' AND s.attempt < 1),
         format('%s run is on attempt %s of max_attempts %s', s.status, s.attempt, s.max_attempts))
    ) AS v (invariant, broken, detail)
    WHERE v.broken;

    -- Orphaned claims: the reaper should have taken these lease_grace after expiry.
    RETURN QUERY
    SELECT 'lease_expired_unreaped'::text, a.id,
           format('running on worker %s (attempt %s of %s), lease expired %s ago, grace %s: is a reaper running?',
                  a.worker_id, a.attempt, a.max_attempts,
                  date_trunc('second', now() - a.claim_expires_at), audit.lease_grace)
    FROM runrow.agent_run AS a
    WHERE a.status = 'running'
      AND a.claim_expires_at < now() - audit.lease_grace;

    -- Invariant 1 (the partial unique index is the guarantee; this notices it gone).
    RETURN QUERY
    SELECT 'conversation_has_multiple_active'::text, m.id,
           format('conversation %s has %s active runs; this one is %s', m.conversation_id, m.n, m.status)
    FROM (
        SELECT a.id, a.conversation_id, a.status, count(*) OVER (PARTITION BY a.conversation_id) AS n
        FROM runrow.agent_run AS a
        WHERE a.status IN ('running', 'waiting')
    ) AS m
    WHERE m.n > 1;

    -- A claimable turn (no active or earlier queued turn in its conversation) that nobody
    -- claimed for queued_age since it became claimable: since it (re)entered the queue
    -- (updated_at; only the claim's blocked mark also writes a queued row, and that is cleared
    -- when the turn ahead ends), its not_before (start_in, a retry_in backoff, defer_run) or
    -- the previous turn ended, whichever is latest. A turn blocked behind an active one is not
    -- reported: the blocker is; nor is one whose not_before is still ahead (not claimable yet).
    RETURN QUERY
    SELECT 'queued_too_long'::text, q.id,
           format('claimable for %s (threshold %s), enqueued %s, attempt %s of %s: are workers claiming?',
                  date_trunc('second', now() - c.since), audit.queued_age, q.created_at, q.attempt, q.max_attempts)
    FROM runrow.agent_run AS q
    CROSS JOIN LATERAL (
        -- Since when it could have been claimed: its last change, its not_before, or the end
        -- of the latest earlier turn; and whether an open turn is still ahead of it (an
        -- earlier queued one, or an active one). The ended and the open turns, each through
        -- its index.
        SELECT greatest(q.updated_at, q.not_before, (
                   SELECT max(p.finished_at) FROM runrow.agent_run AS p
                   WHERE p.conversation_id = q.conversation_id
                     AND p.enqueue_seq < q.enqueue_seq
                     AND p.status IN ('completed', 'failed', 'cancelled', 'dead')
               )) AS since,
               EXISTS (
                   SELECT 1 FROM runrow.agent_run AS p
                   WHERE p.conversation_id = q.conversation_id
                     AND p.status IN ('running', 'waiting')
               ) OR EXISTS (
                   SELECT 1 FROM runrow.agent_run AS p
                   WHERE p.conversation_id = q.conversation_id
                     AND p.status = 'queued'
                     AND p.enqueue_seq < q.enqueue_seq
               ) AS blocked
    ) AS c
    WHERE q.status = 'queued'
      AND (q.not_before IS NULL OR q.not_before <= now())
      AND NOT coalesce(c.blocked, false)
      AND c.since < now() - audit.queued_age;

    -- A queued turn marked claim_blocked (the claim's note that it waits behind another turn
    -- of its conversation, which keeps it out of agent_run_claimable) with no active or
    -- earlier open turn left: no claim would ever take it. Marked turns are queued, so this
    -- reads the live set only.
    RETURN QUERY
    SELECT 'claimable_turn_marked_blocked'::text, q.id,
           format('queued turn of conversation %s is marked blocked but nothing is ahead of it: '
                  'no claim will take it (the turn ahead ended without clearing the mark)', q.conversation_id)
    FROM runrow.agent_run AS q
    WHERE q.status = 'queued'
      AND q.claim_blocked
      AND NOT EXISTS (
          SELECT 1 FROM runrow.agent_run AS p
          WHERE p.conversation_id = q.conversation_id
            AND p.status IN ('running', 'waiting')
      )
      AND NOT EXISTS (
          SELECT 1 FROM runrow.agent_run AS p
          WHERE p.conversation_id = q.conversation_id
            AND p.status = 'queued'
            AND p.enqueue_seq < q.enqueue_seq
      );

    -- The journal and the step log of every run in scope (live runs, and runs finished
    -- within history_window), each read through its (run_id, seq) primary key: seq must be
    -- exactly 1..n (a journal trimmed whole has no rows and is fine; steps are never
    -- trimmed), at most one complete event, which only a terminal run has, and a terminal
    -- run whose journal is still there ends with one. A completed run whose journal streamed
    -- text (text_delta events, the reference worker's) must have streamed its answer
    -- (result.text) last: the deltas' text, in seq order, ends with it. That is what a tail
    -- or an SSE viewer shows; "ends with" rather than "the final attempt's text is" because
    -- an attempt that resumes to find its answer already in the step log streams nothing.
    -- A journal without text deltas (trimmed, or a worker that streams none) is not judged.
    -- The same pass reads it; the only payloads read are completed runs' text deltas.
    RETURN QUERY
    WITH scope AS MATERIALIZED (
        SELECT a.id, a.status, NULL::text AS answer FROM runrow.agent_run AS a WHERE a.status = 'queued'
        UNION ALL
        SELECT a.id, a.status, NULL::text FROM runrow.agent_run AS a WHERE a.status IN ('running', 'waiting')
        UNION ALL
        SELECT a.id, a.status,
               CASE WHEN a.status = 'completed' AND jsonb_typeof(a.result -> 'text') = 'string'
                    THEN nullif(a.result ->> 'text', '') END
        FROM runrow.agent_run AS a
        WHERE a.finished_at >= now() - audit.history_window
          AND a.status IN ('completed', 'failed', 'cancelled', 'dead')
    )
    SELECT v.invariant, s.id, v.detail
    FROM scope AS s
    CROSS JOIN LATERAL (
        SELECT count(*) AS n, min(e.seq) AS lo, max(e.seq) AS hi,
               count(*) FILTER (WHERE e.type = 'complete') AS completes,
               max(e.seq) FILTER (WHERE e.type = 'run_claimed') AS last_claim,
               coalesce(string_agg(e.payload ->> 'text', '' ORDER BY e.seq)
                   FILTER (WHERE s.answer IS NOT NULL AND e.type = 'text_delta'), '') AS streamed
        FROM runrow.run_event AS e
        WHERE e.run_id = s.id
    ) AS j
    CROSS JOIN LATERAL (
        SELECT count(*) AS n, min(st.seq) AS lo, max(st.seq) AS hi
        FROM runrow.agent_step AS st
        WHERE st.run_id = s.id
    ) AS p
    CROSS JOIN LATERAL (VALUES
        ('journal_seq_gap', j.n > 0 AND (j.lo <> 1 OR j.hi <> j.n),
         format('journal has %s events numbered %s..%s; expected 1..%s', j.n, j.lo, j.hi, j.n)),
        ('step_seq_gap', p.n > 0 AND (p.lo <> 1 OR p.hi <> p.n),
         format('step log has %s steps numbered %s..%s; expected 1..%s', p.n, p.lo, p.hi, p.n)),
        ('multiple_complete_events', j.completes > 1,
         format('journal has %s complete events', j.completes)),
        ('complete_event_on_live_run', s.status IN ('queued', 'running', 'waiting') AND j.completes > 0,
         format('%s run has a complete event in its journal', s.status)),
        ('terminal_run_without_complete',
         s.status IN ('completed', 'failed', 'cancelled', 'dead') AND j.n > 0 AND j.completes = 0,
         format('%s run has %s journal events and no complete event', s.status, j.n)),
        ('journal_missing_result_text',
         s.answer IS NOT NULL AND j.streamed <> '' AND right(j.streamed, length(s.answer)) <> s.answer,
         format('completed run''s result.text (%s characters) is not the end of the %s characters of '
                'text_delta text in its journal (last run_claimed at seq %s): viewers of the journal '
                'see another answer',
                length(s.answer), length(j.streamed), j.last_claim))
    ) AS v (invariant, broken, detail)
    WHERE v.broken;

    -- Tool calls that may have begun and have no result (executing, uncertain), begun more
    -- than intent_age ago, where nothing will move them on: a running run's tool that
    -- hangs, or a call left open by a run that ended (it may have happened; reported for
    -- history_window after the ending, after which runrow.open_tool_effects still lists
    -- it). A queued or waiting run's open call is not reported: its next attempt begins it
    -- again (execute again, or uncertain for a person), and a queue or a person that does
    -- not move is reported by queued_too_long or approval_waiting_too_long. Served by
    -- tool_effect_open (the rows that are not done).
    RETURN QUERY
    SELECT 'intent_without_result'::text, e.run_id,
           format('%s call %s of tool %s (key %s) began %s ago (threshold %s) and has no result; run is %s',
                  e.effect, e.state, e.tool, e.idempotency_key,
                  date_trunc('second', now() - coalesce(e.started_at, e.created_at)), audit.intent_age, r.status)
    FROM runrow.tool_effect AS e
    JOIN runrow.agent_run AS r ON r.id = e.run_id
    WHERE e.state <> 'done'
      AND e.state IN ('executing', 'uncertain')
      AND coalesce(e.started_at, e.created_at) < now() - audit.intent_age
      AND (r.status = 'running' OR r.finished_at >= now() - audit.history_window);

    -- A person has been asked (needs_approval, or uncertain: it may have happened) and has
    -- not answered for approval_age; the run is parked as waiting meanwhile and holds its
    -- conversation. Served by tool_effect_pending.
    RETURN QUERY
    SELECT 'approval_waiting_too_long'::text, e.run_id,
           format('%s call of tool %s (key %s) has waited %s for a decision (threshold %s)',
                  e.state, e.tool, e.idempotency_key, date_trunc('second', now() - e.updated_at), audit.approval_age)
    FROM runrow.tool_effect AS e
    JOIN runrow.agent_run AS r ON r.id = e.run_id
    WHERE e.state IN ('needs_approval', 'uncertain')
      AND r.status = 'waiting'
      AND e.updated_at < now() - audit.approval_age;

    -- A waiting run with nothing to decide can never be resumed by resolve_approval.
    RETURN QUERY
    SELECT 'waiting_without_pending_approval'::text, a.id,
           format('run is waiting since %s but none of its tool calls awaits a decision', a.updated_at)
    FROM runrow.agent_run AS a
    WHERE a.status = 'waiting'
      AND NOT EXISTS (
          SELECT 1 FROM runrow.tool_effect AS e
          WHERE e.run_id = a.id AND e.state IN ('needs_approval', 'uncertain'));

    -- The schema's own guards: a constraint, unique index or trigger that someone dropped
    -- or disabled (say, for maintenance) turns every invariant above from impossible into
    -- merely unlikely. Catalog lookups only.
    RETURN QUERY
    SELECT 'schema_guard_missing'::text, NULL::uuid,
           format('%s %s on runrow.%s is missing, invalid or disabled', g.kind, g.name, g.tbl)
    FROM (VALUES
        -- Since 0045 the six rules on status, attempt, claim and finish, in one CHECK.
        ('constraint', 'agent_run_state', 'agent_run'),
        ('unique index', 'agent_run_one_active_per_conversation', 'agent_run'),
        ('unique index', 'agent_run_idempotency_key', 'agent_run'),
        ('unique index', 'agent_run_one_retry', 'agent_run'),
        ('unique index', 'run_event_pkey', 'run_event'),
        -- Since 0034 the rules on what an enqueue sets, when those columns are written.
        ('trigger', 'agent_run_settings', 'agent_run'),
        -- Once per statement: turn order and unblocking the next turn (0028); the sticky and
        -- lifecycle rules and the webhook outbox (0042; row triggers before).
        ('trigger', 'agent_run_after_update', 'agent_run'),
        -- A run's identity, when a statement assigns one of its columns (0044).
        ('trigger', 'agent_run_identity_guard', 'agent_run'),
        ('trigger', 'agent_run_no_delete', 'agent_run'),
        ('trigger', 'agent_run_no_truncate', 'agent_run'),
        ('trigger', 'run_event_guard', 'run_event'),
        -- Since 0024 the journal's delete rule (only an ended run's journal may go) is its own.
        ('trigger', 'run_event_delete_guard', 'run_event'),
        ('trigger', 'run_event_no_truncate', 'run_event'),
        ('trigger', 'message_guard', 'message'),
        -- Since 0056 the three row rules of a message, in one CHECK.
        ('constraint', 'message_rules', 'message'),
        ('trigger', 'prompt_immutable', 'prompt'),
        -- Since 0050 prompts are never deleted: a run's prompt is checked once, at insert.
        ('trigger', 'prompt_no_truncate', 'prompt'),
        -- Since 0048 the eight row rules of a step, in one CHECK.
        ('constraint', 'agent_step_rules', 'agent_step'),
        ('unique index', 'agent_step_pkey', 'agent_step'),
        ('unique index', 'agent_step_one_result_per_tool_use', 'agent_step'),
        ('trigger', 'agent_step_guard', 'agent_step'),
        ('trigger', 'agent_step_no_truncate', 'agent_step'),
        -- Since 0053 the fourteen row rules of a tool call, in one CHECK.
        ('constraint', 'tool_effect_rules', 'tool_effect'),
        ('unique index', 'tool_effect_pkey', 'tool_effect'),
        ('unique index', 'tool_effect_one_per_tool_use', 'tool_effect'),
        ('trigger', 'tool_effect_guard', 'tool_effect'),
        ('trigger', 'tool_effect_no_truncate', 'tool_effect'),
        ('trigger', 'agent_run_owner_guard', 'agent_run'),
        ('trigger', 'conversation_immutable', 'conversation'),
        -- Since 0052 a run's conversation and message are checked at insert (agent_run_owner_guard),
        -- so neither table may be emptied under its runs.
        ('trigger', 'conversation_no_truncate', 'conversation'),
        ('trigger', 'message_no_truncate', 'message'),
        ('unique index', 'webhook_delivery_run_id_key', 'webhook_delivery'),
        -- Since 0058 the nine row rules of a delivery, in one CHECK.
        ('constraint', 'webhook_delivery_rules', 'webhook_delivery'),
        -- Since 0106 (validated by 0111): a lapsed lease's token only beside no lease.
        ('constraint', 'webhook_delivery_lapsed_token', 'webhook_delivery'),
        ('trigger', 'webhook_delivery_guard', 'webhook_delivery'),
        -- Since 0067: a cron that does not parse would stop every firing pass at it.
        ('trigger', 'schedule_cron_parses', 'schedule'),
        -- Since 0081 (a CHECK before): a name that cannot be typed back to drop the schedule.
        ('trigger', 'schedule_name_printable', 'schedule')
    ) AS g (kind, name, tbl)
    WHERE NOT CASE g.kind
        WHEN 'constraint' THEN EXISTS (
            SELECT 1 FROM pg_catalog.pg_constraint AS c
            WHERE c.conrelid = to_regclass('runrow.' || g.tbl) AND c.conname = g.name AND c.convalidated)
        WHEN 'unique index' THEN EXISTS (
            SELECT 1 FROM pg_catalog.pg_index AS i
            JOIN pg_catalog.pg_class AS ic ON ic.oid = i.indexrelid
            WHERE i.indrelid = to_regclass('runrow.' || g.tbl) AND ic.relname = g.name
              AND i.indisunique AND i.indisvalid AND i.indisready)
        ELSE EXISTS (
            SELECT 1 FROM pg_catalog.pg_trigger AS t
            WHERE t.tgrelid = to_regclass('runrow.' || g.tbl) AND t.tgname = g.name AND t.tgenabled <> 'D')
    END;
END
$fn$;

COMMENT ON FUNCTION runrow.audit(interval, interval, interval, interval, interval) IS
'Health check for DBAs: zero rows means healthy, otherwise one row per violation as '
'(invariant, run_id, detail). Thresholds (not NULL, not negative): lease_grace (60 s), '
'intent_age (10 min), approval_age (24 h), queued_age (15 min); history_window (7 days) bounds '
'the checks that read history. Invariant ids: '
'lease_expired_unreaped (running, lease expired more than lease_grace ago: no reaper running); '
'running_without_claim (running without token, worker or lease); '
'terminal_run_holds_claim / idle_run_holds_claim (a terminal / queued or waiting run still has '
'a claim token, in all history, or a lease, within history_window); '
'terminal_without_finished_at / live_run_has_finished_at (finished_at disagrees with status); '
'attempt_out_of_range (attempt above max_attempts, or a running run on attempt 0; ended runs '
'within history_window); '
'conversation_has_multiple_active (more than one running or waiting run in a conversation); '
'queued_too_long (a claimable turn unclaimed for queued_age since it became claimable: since '
'it was queued, its not_before (start_in, retry_in, defer_run) or the turn before it ended, '
'whichever is latest; a turn not due yet or blocked behind an active turn is not reported, the '
'blocker is); '
'claimable_turn_marked_blocked (a queued turn the claim marked as waiting behind another turn '
'of its conversation, with nothing ahead of it any more: no claim would take it); '
'journal_seq_gap / step_seq_gap (run_event / agent_step seq not exactly 1..n; a journal '
'trimmed whole is fine); '
'multiple_complete_events (more than one complete event); '
'complete_event_on_live_run (queued, running or waiting run with a complete event); '
'terminal_run_without_complete (terminal run whose untrimmed journal has no complete event); '
'journal_missing_result_text (a completed run whose journal streamed text in text_delta events '
'that does not end with result.text: the events of an attempt were lost); '
'intent_without_result (a tool call executing or uncertain, begun more than intent_age ago, '
'no result, in a running run (a hung tool) or a run that ended within history_window (it may '
'have happened and nothing will record it)); '
'approval_waiting_too_long (a waiting run''s call has awaited a person''s decision for more '
'than approval_age); '
'waiting_without_pending_approval (a waiting run with no call awaiting a decision: nothing can '
'resume it); '
'schema_guard_missing (run_id NULL: a constraint, unique index or trigger that keeps these '
'invariants is missing, invalid or disabled). '
'Cost: live runs through partial indexes, terminal rows through the empty-when-healthy index '
'agent_run_terminal_anomaly; the journal and step checks read the (run_id, seq) primary keys of '
'live runs and of runs finished within history_window, so their cost grows with the work of that '
'window; pass a long window (say ''100 years'') for a full-history scan.';

REVOKE ALL ON FUNCTION runrow.audit(interval, interval, interval, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.audit(interval, interval, interval, interval, interval) TO runrow_auditor;
