-- depends: 0078_webhook_cap_per_receiver
-- Schedules: what an audit of the firing passes found, and their metrics.
--
-- - A schedule a pass left due because it was busy (its conversation locked by another session,
--   its if_active = interrupt stop timed out) counted toward the pass's max_schedules, and every
--   pass took the due schedules oldest first, so the same busy ones came first every time: with
--   100 busy due schedules (the default max_schedules) no other schedule of the fleet ever fired.
--   A pass now counts only the schedules it moves on (fired, or failed for good), looks at no
--   more than 10 x max_schedules due schedules, and stamps each one it leaves due with
--   passed_over_at: the pass's instant, after every tick due then, so the next passes take the
--   schedules due before it first and a busy one waits its turn behind them
--   (functions/_schedule_helpers.sql, _fire_schedules).
-- - Operators had no alert for schedules: a fleet whose passes did not fire (no worker running
--   the reaper, busy schedules, a pass failing) showed nothing in the metrics scrape.
--   queue_metrics gets schedules_overdue (next tick more than 5 minutes past due: above a
--   reaper pass's interval of any worker, 15 s jittered up to 22.5 s, the Node worker's about a
--   lease), oldest_due_tick_age_seconds (how long the oldest unfired due tick has been due, 0
--   when none) and schedules_with_last_error (schedules whose last tick enqueued nothing, or that
--   a pass left due, or stopped). The exporter makes each a gauge (runrow_<column>).
-- A column without a default is added without a rewrite; the indexes are on a table of one row
-- per schedule.

ALTER TABLE runrow.schedule
ADD COLUMN passed_over_at timestamptz;

COMMENT ON COLUMN runrow.schedule.passed_over_at IS
'The instant of the last firing pass that left this schedule due because it was busy (its '
'conversation locked, its interrupt timed out); NULL once a pass moves it on. Passes take '
'due schedules in the order of greatest(next_fire_at, passed_over_at), so a busy schedule '
'goes behind every schedule that was due when it was passed over.';

-- The firing order, and what a pass reads: its cost is the schedules it looks at.
CREATE INDEX schedule_fire_order ON runrow.schedule ((greatest(next_fire_at, passed_over_at)), next_fire_at);

-- The metrics' count of schedules with an error reads only them.
CREATE INDEX schedule_with_last_error ON runrow.schedule (id) WHERE last_error IS NOT NULL;

-- 0077's view, three columns appended. The schedules' part reads the due schedules through
-- schedule_due (next_fire_at), a range of the index, and the erroring ones through
-- schedule_with_last_error: never every schedule.

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
    ) AS schedules_with_last_error
FROM runrow.queue_health AS h
CROSS JOIN c
CROSS JOIN d
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
'backoff; rate_limit_keys_blocked = rate-limit keys blocked now, by a reported 429 or a key error; '
'tenants_over_budget = tenants at their daily budget; webhooks_pending = deliveries not yet '
'made (new, retrying or in flight); webhooks_dead_lettered = deliveries that gave up; '
'oldest_pending_webhook_age_seconds = age of the oldest undelivered one, 0 when none; '
'rate_limit_keys_key_error = rate-limit keys whose API key or account error has not cleared '
'(report_key_error: blocked, or between a block and its probe''s answer); '
'schedules_overdue = schedules whose next tick is more than 5 minutes past due (no pass fired '
'it: no worker runs the reaper, or the schedule is busy); oldest_due_tick_age_seconds = how '
'long the oldest due tick not fired yet has been due, 0 when none; schedules_with_last_error = '
'schedules whose last_error is set (the last tick enqueued nothing, a pass left it due, or its '
'cron stopped it: runrow.schedules says why). Readable by the worker, client and auditor '
'roles: counts only, no run or user.';
