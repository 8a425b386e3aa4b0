-- depends: 0109_unanswered_429s
-- Three defects of a key error's 403 rules as migration 0107 left them (the third review of
-- session 61; pgtap/key_error_answerer.sql asserts each). The functions are in functions/
-- (acquire_model_call, report_key_error, _key_has_other_answerer in _key_has_other_answerer.sql,
-- _key_error_told in _limits_helpers.sql); this migration adds the columns they read.
--
-- (1) Past its time bound acquire_model_call makes a refused run the key's probe whatever else
-- waits, but report_key_error's lone-run rule still counted a queued run the claim never hands
-- out (its concurrency key paused or full): the run was refused every block, an API call each,
-- and never failed. The grant now records that the probe was forced (key_probe_forced), and the
-- lone-run rule then counts only running runs as able to answer.
-- (2) The age was the key's streak's: once the key had refused 600 s, every run already refused
-- failed at its next probe (a 30-minute key-wide outage failed all the key's runs, one a block,
-- and a run enqueued late in it failed at its second refusal). Each run's own first refusal in
-- the streak is kept now (key_error_first_refused_at), the age is measured from it, and a run
-- whose key has other runs refused with a 403 too (a refusal shared by several requests: the
-- key's, most likely) waits report_key_error's give_up_after_seconds (default 3600) instead.
-- (3) report_key_error counted a run due by the end of a 429 block on the key (up to a day) as
-- able to answer: the helper reads the key error's own hold (key_error_until) now.
--
-- agent_run's column goes at the end of the row, behind the model-call columns: a claim, a
-- heartbeat and a finish never write it.

ALTER TABLE runrow.agent_run
ADD COLUMN key_error_first_refused_at timestamptz;

COMMENT ON COLUMN runrow.agent_run.key_error_first_refused_at IS
'When this run''s request was first refused with its 403 (key_error_refused) in the current run '
'of such refusals (report_key_error: kept while the same 403 comes back with no answer of the key '
'since, set anew otherwise or when the key''s streak began later; NULL for another key error). '
'report_key_error''s lone-run rule and acquire_model_call''s bound on probe_elsewhere measure the '
'run''s age from it, not from the key''s streak (key_error_since): a run enqueued late in a long '
'outage is not failed at its second refusal.';

-- 0073: a column is the auditor's only when granted.
GRANT SELECT (key_error_first_refused_at) ON runrow.agent_run TO runrow_auditor;

-- Runs already refused: their age counts from the key's streak, as it did (the best known).
UPDATE runrow.agent_run AS a
SET key_error_first_refused_at = l.key_error_since
FROM runrow.rate_limit AS l
WHERE
    a.status IN ('queued', 'running') AND a.key_error_refused IS NOT NULL
    AND l.rate_limit_key = a.rate_limit_key AND a.key_error_answers = l.key_answers;

ALTER TABLE runrow.rate_limit
ADD COLUMN key_probe_forced boolean;

COMMENT ON COLUMN runrow.rate_limit.key_probe_forced IS
'Whether the key''s probe out (key_probe_by) was granted to a run refused with a 403 past '
'acquire_model_call''s bound on probe_elsewhere, whatever else of the key waited (the runs it '
'would have been left to may be ones the claim never hands out). report_key_error''s lone-run '
'rule then counts only running runs as able to answer. Read only with key_probe_by.';

COMMENT ON COLUMN runrow.rate_limit.key_error_since IS
'When the key''s current streak of API key or account errors began (report_key_error), by the '
'database clock; NULL while the key works. A run''s own first refusal with a 403 is never taken '
'as earlier (agent_run.key_error_first_refused_at, from which the 403 rules measure a run''s age, '
'migration 0110).';

COMMENT ON COLUMN runrow.rate_limit.key_error_max_block IS
'The max_block_seconds report_key_error was last given for the key''s streak of API key or '
'account errors (NULL before migration 0107 or any key error; left as it is when the key '
'answers: read only during a streak). acquire_model_call''s bound on probe_elsewhere: once a run '
'refused with a 403 since the key''s last answer has been refused greatest(key_error_max_block, '
'600) s (agent_run.key_error_first_refused_at) and the key''s block has been over 15 s, it is the '
'probe whatever else of the key waits (key_probe_forced).';

-- report_key_error gains give_up_after_seconds (functions/report_key_error.sql defines it), and
-- _key_has_other_answerer its running_only and refused (functions/_key_has_other_answerer.sql).
DROP FUNCTION IF EXISTS runrow.report_key_error(uuid, uuid, text, numeric, numeric, boolean);
DROP FUNCTION IF EXISTS runrow._key_has_other_answerer(runrow.rate_limit, uuid, uuid);
