-- depends: 0039_journal_nothing_after_complete
-- A finished run is indexed by finished_at once, not twice (issue 11: WAL per lifecycle).
--
-- Until now every ending wrote two B-tree entries for the same key: agent_run_finished_idx
-- (finished_at of every finished run: the history window of audit() and the DBA views) and
-- agent_run_untrimmed (finished_at of the finished runs whose journal is still there:
-- trim_journal's work list). The finish cannot be a HOT update, so each is a leaf insert and
-- about 64 bytes of WAL on every run's ending.
--
-- Now the finished runs are split in two by whether their journal is trimmed: the untrimmed ones
-- in agent_run_untrimmed, as before, and the trimmed ones in agent_run_trimmed. A run's
-- version is in exactly one of them, so an ending writes one entry, and trim_journal's update
-- (request_snapshot set to NULL, never HOT either) moves the run from one to the other as it
-- moved it out of agent_run_untrimmed before. The two together index what
-- agent_run_finished_idx indexed, and no entry twice.
--
-- A window of history ("finished in the last 24 hours") is read through both: its query says
-- "(request_snapshot IS NOT NULL OR request_snapshot IS NULL)", one arm per index, and the
-- planner unions two index scans (BitmapOr). The filter is always true; it is there so each arm
-- implies one index's predicate. run_stats, run_attempts, spend_by_run and audit() say it; a
-- DBA's own query over finished_at should say it too (README, "For DBAs").
--
-- Measured: see the commit message.

CREATE INDEX agent_run_trimmed ON runrow.agent_run (finished_at)
WHERE finished_at IS NOT NULL AND request_snapshot IS NULL;

COMMENT ON INDEX runrow.agent_run_trimmed IS
'Finished runs whose journal trim_journal has deleted (request_snapshot NULL), by finished_at. '
'With agent_run_untrimmed it indexes every finished run once: read a window of history through '
'both with finished_at >= ... AND (request_snapshot IS NOT NULL OR request_snapshot IS NULL).';

DROP INDEX runrow.agent_run_finished_idx;

CREATE OR REPLACE VIEW runrow.run_stats AS
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
        -- One arm per index of finished runs (migration 0040).
        AND (a.request_snapshot IS NOT NULL OR a.request_snapshot IS NULL)
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
'runs that never started are left out). History is read through agent_run_untrimmed and '
'agent_run_trimmed only; all-time counts are SELECT status, count(*) FROM runrow.agent_run '
'GROUP BY 1 (a full scan).';

CREATE OR REPLACE VIEW runrow.run_attempts AS
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
        -- One arm per index of finished runs (migration 0040).
        AND (a.request_snapshot IS NOT NULL OR a.request_snapshot IS NULL)
)

SELECT
    c.status,
    c.attempt,
    count(*) AS runs
FROM counted AS c
GROUP BY c.status, c.attempt
ORDER BY c.status, c.attempt;

-- One SELECT whose WHERE is an OR of what each index serves: the queued runs, the active ones
-- and the day's finished ones in their two parts, so the planner unions four index scans
-- (BitmapOr). The open runs were one test over three statuses, which no index covers: the view
-- read the whole table.
CREATE OR REPLACE VIEW runrow.spend_by_run AS
SELECT
    a.id AS run_id,
    a.status,
    a.fairness_key,
    a.model,
    a.spent_tokens,
    a.token_budget,
    a.spent_cost,
    a.cost_budget,
    a.budget_exhausted
FROM runrow.agent_run AS a
WHERE
    a.status = 'queued'
    OR a.status IN ('running', 'waiting')
    OR (
        a.finished_at > now() - interval '24 hours'
        -- One arm per index of finished runs (migration 0040).
        AND (a.request_snapshot IS NOT NULL OR a.request_snapshot IS NULL)
    );
