-- depends: 0069_result_portable
-- run_stats counts what ran: the earlier turns fork_run copies into a fork's conversation
-- are inserted as they ended, with their source's finished_at (before the copy's created_at),
-- so every fork of a turn that ended in the last 24 hours counted its history again: three
-- turns and two forks showed 7 completed (the history audit). The view is 0061's with one
-- predicate more: a run that names a source (forked_from) and ended at its source's instant
-- is such a copy. Only forks pay its lookup, by primary key.

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
        -- Not a fork's copy of an earlier turn: fork_run inserts those as they ended, with the
        -- source's finished_at, so each fork counted its history again (the history audit). A
        -- fork's own run ends in a transaction of its own, never at its source's instant.
        AND NOT (
            a.forked_from IS NOT NULL
            AND a.finished_at = (
                SELECT f.finished_at FROM runrow.agent_run AS f
                WHERE f.id = a.forked_from
            )
        )
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
'runs that never started are left out). The earlier turns a fork copies (fork_run) are not '
'counted: they ran once, in their own conversation. History is read through agent_run_finished '
'only; all-time counts are SELECT status, count(*) FROM runrow.agent_run '
'GROUP BY 1 (a full scan).';
