-- depends: 0108_step_ending
-- A 429 that never clears was deferred for ever when the API's retry-after is longer than the
-- worker's longest wait in place (rate_limit_max_wait, 10 s): the agent reports the 429,
-- acquire_model_call answers blocked for the retry-after, and the agent defers the run with the
-- reason "blocked: waiting ...", its attempt given back. Each claim then reports one 429, never
-- more than 5, so defer_run's cap on deferrals for 429s (0103, 0106) never counted one, and each
-- of those 429s blocked the key for the whole fleet (the review of session 61,
-- pgtap/defer_run_unanswered_429s.sql).
--
-- The bound is now the run's 429s without an answer between, whatever the claims and the
-- reasons: agent_run.unanswered_429s counts the 429s report_rate_limited heard for the run since
-- its last answered model call (a usage settled: append_step's, record_usage's, in
-- runrow._settle_usage, which sets it back to 0), and defer_run releases the run instead of
-- deferring it once the count reaches 24, its attempt spent as past the cap on deferrals (so
-- max_attempts bounds it). 24 = (5 429s an attempt allows + 1) x (3 deferrals for 429s + 1):
-- what the agent's own cap lets a limit that never clears cost (pyworker/agent/limits.py), so
-- a run the agent defers by its cap meets that cap first, and any other run no later than it
-- would. The count is not reset by a release: the run's next deferral without an answer
-- releases it again (as a deferral past the cap on deferrals for 429s does).
--
-- At the end of the row with 0103's and 0106's columns, behind every column a claim, a
-- heartbeat and a finish write (tests/test_agent_run_layout.py); a NOT NULL default is the
-- catalogue's (no rewrite). No CHECK, for 0103's reason: one is evaluated on every update of the
-- row. The runs waiting now start from 0: a run deferred for ever before the upgrade is bounded
-- after 24 more 429s.
ALTER TABLE runrow.agent_run
ADD COLUMN unanswered_429s smallint NOT NULL DEFAULT 0;

COMMENT ON COLUMN runrow.agent_run.unanswered_429s IS
'How many 429s report_rate_limited heard for this run since its last answered model call (a '
'usage settled, by append_step or record_usage), whatever the claim, at most 32767. Once it '
'reaches 24 ((5 + 1) x (3 + 1): 6 429s in each of an attempt and its 3 deferrals for 429s) '
'defer_run releases the run instead of deferring it, its attempt spent. Written by '
'report_rate_limited (one more) and the settle of a usage (0).';

-- 0073: a column is the auditor's only when granted.
GRANT SELECT (unanswered_429s) ON runrow.agent_run TO runrow_auditor;
