-- depends: 0102_webhook_late_complete
-- (1) The agent's cap on deferrals for 429s (pyworker/agent/limits.py: a run refused 6 times in one
-- attempt is deferred, its attempt given back, at most 3 times; after that such a 429 spends an
-- attempt) lived only in the Python worker, which counted the earlier deferrals by paging the
-- run's whole journal. Another worker (examples/node), a bug, or a trimmed journal deferred for
-- ever, each deferral after a run of 429s that blocked the key for the whole fleet. The count is
-- the run's now (agent_run.cap_429_deferrals, written only by defer_run), and defer_run keeps the
-- cap: a deferral whose reason begins with 429_cap past the third is not one, it spends the
-- attempt as release_run does (functions/defer_run.sql).
--
-- agent_run's column goes at the end of the row, behind the model-call and key-error columns
-- (0080, 0084, 0095, 0099): a claim, a heartbeat and a finish never write it, and a NOT NULL
-- default is the catalogue's (no rewrite). No CHECK: one is evaluated on every update of the
-- row, the claim's and the heartbeat's too, and defer_run is the column's only writer.

ALTER TABLE runrow.agent_run
ADD COLUMN cap_429_deferrals smallint NOT NULL DEFAULT 0;

COMMENT ON COLUMN runrow.agent_run.cap_429_deferrals IS
'How many times defer_run deferred this run with a reason beginning 429_cap (a worker''s '
'deferral after too many 429s in one attempt), at most 3: defer_run spends the attempt instead '
'of a fourth (release_run''s ending). Written only by defer_run.';

-- 0073: a column is the auditor's only when granted.
GRANT SELECT (cap_429_deferrals) ON runrow.agent_run TO runrow_auditor;

-- The runs waiting or running now keep the count their journals hold (the worker's count until
-- now): a run deferred 3 times before the upgrade is not given 3 more.
UPDATE runrow.agent_run AS a
SET cap_429_deferrals = least(3, d.n)
FROM (
    SELECT
        e.run_id,
        count(*) AS n
    FROM runrow.run_event AS e
    INNER JOIN runrow.agent_run AS r ON e.run_id = r.id
    WHERE
        r.status IN ('queued', 'running')
        AND e.type = 'run_requeued'
        AND e.payload ->> 'deferred' = 'true'
        AND starts_with(e.payload ->> 'error', '429_cap')
    GROUP BY e.run_id
) AS d
WHERE a.id = d.run_id;

-- (2) Schedules silent after the database clock is set back: a pass run while the clock was ahead
-- (a wrong NTP step) moved next_fire_at to the first tick after that future instant, and once the
-- clock was set back the schedule stayed silent for as long as it had been ahead, with no
-- last_error. Every writer stamps updated_at with now(), so such a row has updated_at > now():
-- each firing pass looks for those through this index (a range that is empty but for then) and
-- moves their next tick back (functions/_schedule_helpers.sql, _rewind_schedules).
CREATE INDEX schedule_updated_at ON runrow.schedule (updated_at);
