-- Views for DBAs and the runrow_auditor role: queue health, run statistics, open tool
-- effects; plus the index that lets runrow.audit() check terminal rows without reading
-- history. Every view reads the live set through the partial indexes of 0001/0002 and
-- history only through agent_run_finished_idx (the last 24 hours), so polling them costs
-- the same with 1 k or 1 M finished runs. now() is the database clock.
-- depends: 0002_steps_and_tools

-- Terminal rows that break a row-level invariant (a claim token left behind, no
-- finished_at): empty on a healthy database, so audit() finds them in all of history for
-- the price of an empty index scan. Only IS [NOT] NULL tests, which the planner estimates
-- well from null_frac (a column-to-column comparison would be guessed at a third of the
-- table and planned as a sequential scan). No column a heartbeat writes appears in it
-- (claim_expires_at does not), so heartbeats stay HOT updates.
CREATE INDEX agent_run_terminal_anomaly ON runrow.agent_run (id)
WHERE
status IN ('completed', 'failed', 'cancelled', 'dead')
AND (claim_token IS NOT NULL OR finished_at IS NULL);

CREATE VIEW runrow.queue_health AS
WITH l AS (
    SELECT
        count(*) FILTER (WHERE a.status = 'running') AS running,
        count(*) FILTER (WHERE a.status = 'waiting') AS waiting,
        count(*) FILTER (
            WHERE a.status = 'running'
            AND a.claim_expires_at >= now()
            AND a.claim_expires_at < now() + interval '10 seconds'
        ) AS leases_expiring_soon,
        count(*) FILTER (
            WHERE a.status = 'running' AND a.claim_expires_at < now()
        ) AS leases_expired
    FROM runrow.agent_run AS a
    WHERE a.status IN ('running', 'waiting')
)

SELECT
    now() AS measured_at,
    q.queued,
    q.oldest_queued_age,
    l.running,
    l.waiting,
    l.leases_expiring_soon,
    l.leases_expired
FROM (
    SELECT
        count(*) AS queued,
        now() - min(a.updated_at) AS oldest_queued_age
    FROM runrow.agent_run AS a
    WHERE a.status = 'queued'
) AS q
CROSS JOIN l;

COMMENT ON VIEW runrow.queue_health IS
'One row, now: queued = queue depth (every queued turn, including turns waiting behind an '
'active turn of their conversation); oldest_queued_age = how long the longest-queued run has '
'been in the queue since it entered it (enqueue, or requeue by reaper, release or approval; '
'NULL when the queue is empty); running; waiting = parked on a person''s approval; '
'leases_expiring_soon = running runs whose lease ends within the next 10 seconds; '
'leases_expired = running runs whose lease has already ended (the reaper takes them after its '
'grace). Reads only the live runs (partial indexes). runrow status shows it.';

CREATE VIEW runrow.run_stats AS
-- queued and running/waiting are two partial indexes; the planner serves each arm of a
-- UNION from one, but an IN over all three statuses from neither.
WITH live AS (
    SELECT
        a.status,
        count(*) AS runs
    FROM runrow.agent_run AS a
    WHERE a.status = 'queued'
    GROUP BY a.status
    UNION ALL
    SELECT
        a.status,
        count(*) AS runs
    FROM runrow.agent_run AS a
    WHERE a.status IN ('running', 'waiting')
    GROUP BY a.status
),

recent AS (
    SELECT
        a.id,
        a.status,
        a.finished_at - a.started_at AS duration,
        st.steps
    FROM runrow.agent_run AS a
    CROSS JOIN
        LATERAL (
            SELECT count(*) AS steps
            FROM runrow.agent_step AS s
            WHERE s.run_id = a.id
        ) AS st
    WHERE
        a.finished_at >= now() - interval '24 hours'
        AND a.status IN ('completed', 'failed', 'cancelled', 'dead')
),

finished AS (
    SELECT
        coalesce(r.status, 'finished') AS status,
        count(*) AS runs,
        percentile_cont(0.5) WITHIN GROUP (ORDER BY r.steps) AS steps_p50,
        percentile_cont(0.95) WITHIN GROUP (ORDER BY r.steps) AS steps_p95,
        percentile_cont(0.5) WITHIN GROUP (ORDER BY r.duration) AS duration_p50,
        percentile_cont(0.95) WITHIN GROUP (ORDER BY r.duration) AS duration_p95
    FROM recent AS r
    GROUP BY GROUPING SETS ((r.status), ())
)

SELECT
    s.status,
    coalesce(l.runs, f.runs, 0) AS runs,
    f.steps_p50,
    f.steps_p95,
    f.duration_p50,
    f.duration_p95
FROM (
    VALUES
    (1, 'queued'), (2, 'running'), (3, 'waiting'),
    (4, 'completed'), (5, 'failed'), (6, 'cancelled'), (7, 'dead'), (8, 'finished')
) AS s (ord, status)
LEFT JOIN live AS l ON s.status = l.status
LEFT JOIN finished AS f ON s.status = f.status
ORDER BY s.ord;

COMMENT ON VIEW runrow.run_stats IS
'One row per status, always all of them. runs: for queued, running and waiting, how many are '
'in that state now; for completed, failed, cancelled and dead, how many ended so in the last '
'24 hours; finished = the four terminal statuses together. For the terminal rows (NULL for '
'the live ones): steps_p50 / steps_p95 = steps in the step log per run (percentile_cont, '
'interpolated; a run stopped before it started counts 0), duration_p50 / duration_p95 = '
'finished_at - started_at (first claim to ending, including requeues and approval waits; '
'runs that never started are left out). History is read through agent_run_finished_idx only; '
'all-time counts are SELECT status, count(*) FROM runrow.agent_run GROUP BY 1 (a full scan).';

CREATE VIEW runrow.run_attempts AS
WITH counted AS (
    SELECT
        a.status,
        a.attempt
    FROM runrow.agent_run AS a
    WHERE a.status = 'queued'
    UNION ALL
    SELECT
        a.status,
        a.attempt
    FROM runrow.agent_run AS a
    WHERE a.status IN ('running', 'waiting')
    UNION ALL
    SELECT
        a.status,
        a.attempt
    FROM runrow.agent_run AS a
    WHERE
        a.finished_at >= now() - interval '24 hours'
        AND a.status IN ('completed', 'failed', 'cancelled', 'dead')
)

SELECT
    c.status,
    c.attempt,
    count(*) AS runs
FROM counted AS c
GROUP BY c.status, c.attempt
ORDER BY c.status, c.attempt;

COMMENT ON VIEW runrow.run_attempts IS
'Attempts distribution: how many runs are in (status, attempt), for the live runs (now) and '
'the runs that ended in the last 24 hours, like run_stats. attempt = claims so far (0: never '
'started). Many runs on attempt > 1 mean workers crash or leases are too short; dead runs '
'exhausted max_attempts.';

CREATE VIEW runrow.open_tool_effects AS
SELECT
    e.idempotency_key,
    e.run_id,
    r.conversation_id,
    r.user_id,
    r.status AS run_status,
    e.tool,
    e.effect,
    e.state,
    e.args,
    e.step_seq,
    e.tool_use_id,
    e.attempt,
    e.started_attempt,
    e.approved,
    e.decided_by,
    e.decided_at,
    e.created_at,
    e.started_at,
    e.updated_at AS state_since,
    now() - e.created_at AS age,
    now() - e.updated_at AS state_age,
    CASE
        WHEN r.status IN ('completed', 'failed', 'cancelled', 'dead')
            THEN 'abandoned'
        WHEN e.state IN ('needs_approval', 'uncertain') AND r.status = 'waiting'
            THEN 'awaiting_decision'
        WHEN e.state = 'executing' AND r.status = 'running'
            THEN 'in_flight'
        WHEN e.state = 'executing'
            THEN 'interrupted'
        ELSE 'awaiting_resume'
    END AS attention,
    e.state IN ('executing', 'uncertain') AS may_have_happened
FROM runrow.tool_effect AS e
INNER JOIN runrow.agent_run AS r ON e.run_id = r.id
WHERE e.state <> 'done';

COMMENT ON VIEW runrow.open_tool_effects IS
'Every tool call without a recorded result (state other than done), for the auditor; the '
'client''s view is pending_approvals. may_have_happened: the call began and no result is '
'recorded (executing, or uncertain: an irreversible call begun again after a crash). '
'attention: awaiting_decision (needs_approval or uncertain, run waiting: resolve_approval), '
'in_flight (executing in a running run), interrupted (executing, its run no longer running: '
'the next attempt executes it again, or makes it uncertain when irreversible), '
'awaiting_resume (approved or rejected, the run not yet resumed), abandoned (the run ended '
'with the call open: nothing will complete it; if may_have_happened, check the tool''s side). '
'age = since the call was recorded, state_age = since its last state change. Served by '
'tool_effect_open.';

GRANT SELECT ON runrow.queue_health, runrow.run_stats, runrow.run_attempts, runrow.open_tool_effects
TO runrow_auditor;
