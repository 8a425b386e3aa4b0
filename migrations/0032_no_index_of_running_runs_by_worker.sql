-- depends: 0031_journal_run_checked_by_its_seq_trigger
-- One more of agent_run's indexes goes (issue 11: WAL per lifecycle). Neither the claim nor
-- the finish can be a HOT update, so each index whose predicate a run's new version meets
-- takes an insert: about 64 bytes of WAL and a B-tree descent.
--
-- agent_run_running (worker_id WHERE status = 'running'): no statement looks a run up by
-- worker_id; the index served "every running run" for the reaper, audit() and the DBA views,
-- and each claim paid an insert for it. agent_run_one_active_per_conversation (status IN
-- ('running', 'waiting')) serves the same scans: its predicate is implied by status =
-- 'running', and waiting runs are few (parked on a person). Both sets are bounded by the
-- fleet's slots, not by history.
--
-- Kept, although only audit() and run_stats read it: agent_run_finished_idx. Their windows of
-- recent history include runs whose journal is already trimmed (their step logs are still
-- audited), which agent_run_untrimmed, trim_journal's index, no longer holds.
--
-- Measured (one session draining 3,000 runs, pg_waldump): see the commit message.

DROP INDEX runrow.agent_run_running;
