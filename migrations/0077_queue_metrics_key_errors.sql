-- depends: 0075_worker_reads_model_prices
-- The fleet's word on a broken API key or account, for an alert: rate_limit_keys_key_error counts
-- the rate-limit keys whose key error (report_key_error, migration 0074) has not cleared. The
-- per-worker gauge runrow_model_key_broken says what that worker last saw, and stayed 1 on a
-- worker that got no run after the key was fixed (the review of issue 11's stop 56);
-- rate_limit_keys_blocked flickers to 0 between a block's end and its probe's hold. The count
-- reads rate_limit, one row per key: a handful of rows.

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
    coalesce(extract(EPOCH FROM w.oldest_pending_age), 0)::double precision AS oldest_pending_webhook_age_seconds,
    (
        SELECT count(*) FROM runrow.rate_limit AS l
        WHERE l.key_errors > 0
    ) AS rate_limit_keys_key_error
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
'backoff; rate_limit_keys_blocked = rate-limit keys blocked now, by a reported 429 or a key error; '
'tenants_over_budget = tenants at their daily budget; webhooks_pending = deliveries not yet '
'made (new, retrying or in flight); webhooks_dead_lettered = deliveries that gave up; '
'oldest_pending_webhook_age_seconds = age of the oldest undelivered one, 0 when none; '
'rate_limit_keys_key_error = rate-limit keys whose API key or account error has not cleared '
'(report_key_error: blocked, or between a block and its probe''s answer). Readable '
'by the worker, client and auditor roles: counts only, no run or user.';
