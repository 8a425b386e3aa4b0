-- trim_journal's index: the terminal runs whose journal has not been trimmed yet. Trimming
-- nulls request_snapshot (the one change a terminal row allows), so "snapshot still set"
-- marks an untrimmed run and this index holds about older_than's worth of finished runs,
-- not history. Without it every trim walked agent_run_finished_idx over all history
-- (measured: 0.4 ms per no-op trim with 1 k finished runs, 137 ms with 300 k).
-- depends: 0005_no_public_execute

CREATE INDEX agent_run_untrimmed ON runrow.agent_run (finished_at)
WHERE finished_at IS NOT NULL AND request_snapshot IS NOT NULL;
