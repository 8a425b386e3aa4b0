-- The database half of the Prometheus scrape (runrow serve's and runrow worker's /metrics):
-- one row, one query per scrape, every column a gauge. The exporter maps the columns by name
-- (pyworker/worker/metrics.py), so a new gauge is one more column here: runs waiting out a
-- backoff or a rate limit and tenants over budget join as columns once their tables exist.
-- Reads queue_health, so it costs what that view costs: the live runs only, through the
-- partial indexes, the same with 1 k or 1 M finished runs.
--
-- The claim also says how long each run waited (queued_seconds, for the enqueue-to-claim
-- histogram): a new column of claim_run's and claim_runs' result, so the old functions go
-- and functions/ recreates them.
-- depends: 0014_schedules

DROP FUNCTION IF EXISTS runrow.claim_run(text, integer);
DROP FUNCTION IF EXISTS runrow.claim_runs(text, integer, integer);
DROP FUNCTION IF EXISTS runrow._claim(text, integer, integer);

CREATE VIEW runrow.queue_metrics AS
SELECT
    h.queued,
    h.running,
    h.waiting,
    h.waiting AS waiting_approval,
    coalesce(extract(EPOCH FROM h.oldest_queued_age), 0)::double precision
        AS oldest_queued_age_seconds,
    h.leases_expired
FROM runrow.queue_health AS h;

COMMENT ON VIEW runrow.queue_metrics IS
'One row of numbers for a metrics scrape, now, each exported as a gauge: queued, running, '
'waiting = queue depth by live status (runrow_queue_depth{status}); waiting_approval = runs '
'parked on a person''s approval (today every waiting run); oldest_queued_age_seconds = how '
'long the longest-queued run has waited since it entered the queue, 0 when the queue is '
'empty; leases_expired = running runs whose lease has lapsed and that no reaper has taken '
'yet. Readable by the worker, client and auditor roles: counts only, no run or user.';

GRANT SELECT ON runrow.queue_metrics TO runrow_worker, runrow_client, runrow_auditor;
