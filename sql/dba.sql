-- What a DBA runs against a runrow database, as a login role granted runrow_auditor:
--   psql "$DATABASE_URL" -X -f sql/dba.sql
-- Every query here reads the live set through partial indexes and history only through a
-- bounded window, so it is safe to run at any time on a busy database (the full-history
-- audit at the end says otherwise and is commented out).

-- 1. Health: zero rows means healthy; otherwise one row per violation:
--    (invariant, run_id, detail). The invariant ids are listed in
--    COMMENT ON FUNCTION runrow.audit (\df+ runrow.audit) and in the README.
SELECT * FROM runrow.audit();

-- The same with thresholds of your own (these are the defaults).
SELECT *
FROM runrow.audit(
    lease_grace => interval '60 seconds',
    intent_age => interval '10 minutes',
    approval_age => interval '24 hours',
    queued_age => interval '15 minutes',
    history_window => interval '7 days'
);

-- 2. The queue now: depth, oldest queued age, running, waiting, leases about to end or
--    already ended (a reaper takes those after its grace).
SELECT * FROM runrow.queue_health;

-- 3. Runs per status (live now; terminal in the last 24 hours) with p50/p95 steps and
--    durations, and how many attempts runs took.
SELECT * FROM runrow.run_stats;
SELECT * FROM runrow.run_attempts;

-- 4. Tool calls without a result, oldest first: what waits on a person
--    (awaiting_decision: decide with runrow.resolve_approval), what may have happened
--    without a record (may_have_happened), what was abandoned by a run that ended.
SELECT
    attention,
    may_have_happened,
    state,
    tool,
    effect,
    run_id,
    run_status,
    age,
    state_age,
    idempotency_key
FROM runrow.open_tool_effects
ORDER BY age DESC;

-- 5. Running runs whose lease ends first: the ones a reaper would take next.
SELECT
    id AS run_id,
    worker_id,
    attempt,
    max_attempts,
    claim_expires_at - now() AS lease_left,
    now() - started_at AS running_for,
    cancel_requested
FROM runrow.agent_run
WHERE status = 'running'
ORDER BY claim_expires_at
LIMIT 20;

-- 6. Dead letters and failures of the last 24 hours (runrow.retry_run(run_id) runs one again),
--    read through agent_run_finished (finished_at of every finished run).
SELECT
    id AS run_id,
    status,
    attempt,
    max_attempts,
    finished_at,
    error
FROM runrow.agent_run
WHERE
    finished_at >= now() - interval '24 hours'
    AND status IN ('dead', 'failed')
ORDER BY finished_at DESC
LIMIT 50;

-- 7. The installed schema version.
SELECT runrow.schema_version();

-- A full-history audit: the seq-gap checks then read every journal and step row (a full
-- scan of run_event and agent_step). Run it off-peak.
-- SELECT * FROM runrow.audit(history_window => interval '100 years');
