-- depends: 0067_schedules_never_wait
-- The metrics scrape's one row says what an operator alerts on (issue 11's metrics audit):
--
-- - oldest_queued_age_seconds counted every queued run: one enqueued with start_in, or released
--   with retry_in (a backoff, a rate limit), grew older for its whole delay, so the README's alert
--   "above your latency budget" fired for every scheduled or backed-off run on an idle fleet;
--   and a turn waiting behind its conversation's running turn (claim_blocked) grew older for as
--   long as that turn ran. It is now the longest wait of a run a worker could claim now: queued,
--   not marked blocked, and due, measured from when it became due (not_before for a delayed
--   run no claim has promoted yet; the promotion resets updated_at).
-- - 0015 said the backoff, rate-limit and budget gauges would "join as columns once their tables
--   exist"; 0017 and 0019 created the tables and nothing joined. Now: queued_claimable,
--   queued_not_due, rate_limit_keys_blocked, tenants_over_budget, webhooks_pending,
--   webhooks_dead_lettered, oldest_pending_webhook_age_seconds. The exporter makes each column a
--   gauge by its name (pyworker/worker/metrics.py).
-- The old columns keep their names and places (CREATE OR REPLACE VIEW appends new ones). Every
-- part reads the live rows through a partial index, as before: the queue, the blocked keys, the
-- budgets' last 25 hours, and the undelivered or dead webhooks.

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
    coalesce(extract(EPOCH FROM w.oldest_pending_age), 0)::double precision AS oldest_pending_webhook_age_seconds
FROM runrow.queue_health AS h
CROSS JOIN c
CROSS JOIN d
CROSS JOIN runrow.webhook_health AS w;

COMMENT ON VIEW runrow.queue_metrics IS
'One row of numbers for a metrics scrape, now, each exported as a gauge: queued, running, '
'waiting = queue depth by live status (runrow_queue_depth{status}); waiting_approval = runs '
'parked on a person''s approval (today every waiting run); oldest_queued_age_seconds = how '
'long the longest-waiting claimable run (queued, due, not behind its conversation''s active '
'turn) has waited since it became claimable, 0 when none is; leases_expired = running runs '
'whose lease has lapsed and that no reaper has taken yet; queued_claimable = queued runs a '
'worker could claim now; queued_not_due = queued runs waiting out start_in or a retry_in '
'backoff; rate_limit_keys_blocked = rate-limit keys blocked by a reported 429; '
'tenants_over_budget = tenants at their daily budget; webhooks_pending = deliveries not yet '
'made (new, retrying or in flight); webhooks_dead_lettered = deliveries that gave up; '
'oldest_pending_webhook_age_seconds = age of the oldest undelivered one, 0 when none. Readable '
'by the worker, client and auditor roles: counts only, no run or user.';
