-- depends: 0089_update_tenant_budget
-- queue_metrics counted no queued run held behind another turn of its conversation (an
-- approval nobody answered, a start_in turn not due yet, a long running turn): such a turn,
-- marked claim_blocked by the first claim that walked it, is in queued but in neither
-- queued_claimable nor queued_not_due, and oldest_queued_age_seconds leaves it out (rightly: no
-- worker can take it). So a conversation stuck for days behind an unanswered approval never
-- showed in any gauge but the total (the audit: start_in turn + a second turn gave queued=2,
-- queued_claimable=0, queued_not_due=1). Two columns appended (CREATE OR REPLACE VIEW can only
-- add columns at the end): queued_blocked, so queued = queued_claimable + queued_not_due +
-- queued_blocked, and oldest_blocked_age_seconds, how long the longest-blocked one has been
-- blocked (its updated_at: the claim's mark writes it, and nothing else writes a queued turn
-- until its mark is cleared). The count reads the queued runs through
-- agent_run_queued_by_conversation, as queue_health's queued count does: linear in the queue
-- (10 000 blocked turns: one index scan), no per-turn probe of its conversation.

-- 0079's view, two columns appended.

CREATE OR REPLACE VIEW runrow.queue_metrics AS
WITH c AS (
    SELECT
        count(*) AS claimable,
        min(a.updated_at) AS oldest
    FROM runrow.agent_run AS a
    WHERE a.status = 'queued' AND NOT a.claim_blocked AND a.not_before IS NULL
),

d AS (
    SELECT
        count(*) FILTER (WHERE a.not_before <= now() AND NOT a.claim_blocked) AS due,
        min(a.not_before) FILTER (WHERE a.not_before <= now() AND NOT a.claim_blocked) AS oldest_due,
        count(*) FILTER (WHERE a.not_before > now()) AS not_due
    FROM runrow.agent_run AS a
    WHERE a.status = 'queued' AND a.not_before IS NOT NULL
),

held AS (
    SELECT
        count(*) AS blocked,
        min(a.updated_at) AS oldest
    FROM runrow.agent_run AS a
    WHERE
        a.status = 'queued' AND a.claim_blocked
        AND (a.not_before IS NULL OR a.not_before <= now())
),

sch AS (
    SELECT
        count(*) FILTER (WHERE s.next_fire_at < now() - interval '5 minutes') AS overdue,
        min(s.next_fire_at) AS oldest_due
    FROM runrow.schedule AS s
    WHERE s.next_fire_at <= now()
)

SELECT
    h.queued,
    h.running,
    h.waiting,
    h.waiting AS waiting_approval,
    coalesce(extract(EPOCH FROM now() - least(c.oldest, d.oldest_due)), 0)::double precision
        AS oldest_queued_age_seconds,
    h.leases_expired,
    c.claimable + d.due AS queued_claimable,
    d.not_due AS queued_not_due,
    (
        SELECT count(*) FROM runrow.rate_limit AS l
        WHERE l.blocked_until > now()
    ) AS rate_limit_keys_blocked,
    (
        SELECT count(*) FROM runrow.tenant_budgets AS b
        WHERE b.over_budget
    ) AS tenants_over_budget,
    w.pending + w.retrying + w.in_flight AS webhooks_pending,
    w.dead_lettered AS webhooks_dead_lettered,
    coalesce(extract(EPOCH FROM w.oldest_pending_age), 0)::double precision AS oldest_pending_webhook_age_seconds,
    (
        SELECT count(*) FROM runrow.rate_limit AS l
        WHERE l.key_errors > 0
    ) AS rate_limit_keys_key_error,
    sch.overdue AS schedules_overdue,
    coalesce(extract(EPOCH FROM now() - sch.oldest_due), 0)::double precision AS oldest_due_tick_age_seconds,
    (
        SELECT count(*) FROM runrow.schedule AS s
        WHERE s.last_error IS NOT NULL
    ) AS schedules_with_last_error,
    held.blocked AS queued_blocked,
    coalesce(extract(EPOCH FROM now() - held.oldest), 0)::double precision AS oldest_blocked_age_seconds
FROM runrow.queue_health AS h
CROSS JOIN c
CROSS JOIN d
CROSS JOIN held
CROSS JOIN sch
CROSS JOIN runrow.webhook_health AS w;

COMMENT ON VIEW runrow.queue_metrics IS
'One row of numbers for a metrics scrape, now, each exported as a gauge: queued, running, '
'waiting = queue depth by live status (runrow_queue_depth{status}); waiting_approval = runs '
'parked on a person''s approval (today every waiting run); oldest_queued_age_seconds = how '
'long the longest-waiting claimable run (queued, due, not behind its conversation''s active '
'turn) has waited since it became claimable, 0 when none is; leases_expired = running runs '
'whose lease has lapsed and that no reaper has taken yet; queued_claimable = queued runs a '
'worker could claim now; queued_not_due = queued runs waiting out start_in or a retry_in '
'backoff (queued_blocked: the rest); rate_limit_keys_blocked = rate-limit keys blocked now, by a reported 429 or a key error; '
'tenants_over_budget = tenants at their daily budget; webhooks_pending = deliveries not yet '
'made (new, retrying or in flight); webhooks_dead_lettered = deliveries that gave up; '
'oldest_pending_webhook_age_seconds = age of the oldest undelivered one, 0 when none; '
'rate_limit_keys_key_error = rate-limit keys whose API key or account error has not cleared '
'(report_key_error: blocked, or between a block and its probe''s answer); '
'schedules_overdue = schedules whose next tick is more than 5 minutes past due (no pass fired '
'it: no worker runs the reaper, or the schedule is busy); oldest_due_tick_age_seconds = how '
'long the oldest due tick not fired yet has been due, 0 when none; schedules_with_last_error = '
'schedules whose last_error is set (the last tick enqueued nothing, a pass left it due, or its '
'cron stopped it: runrow.schedules says why); queued_blocked = queued runs due but held '
'behind another turn of their conversation (running, waiting on an approval, or an earlier '
'queued turn, even one not due yet), counted once a claim has looked at them, so queued = '
'queued_claimable + queued_not_due + queued_blocked; oldest_blocked_age_seconds = how long the '
'longest-held of them has been held, 0 when none (a conversation stuck behind an unanswered '
'approval grows it). Readable by the worker, client and auditor '
'roles: counts only, no run or user.';
