-- depends: 0061_request_snapshot_apart_from_the_run
-- The journal guard reads its run's last seq by run_event's key whatever the statistics say.
-- A trim that empties the journal, then a VACUUM, leaves run_event with a few live rows over
-- many pages and its key's index with as many pages; the planner then priced the lookup by
-- that key above a scan of the whole table, and every journal row written (enqueue, claim,
-- append, finish) scanned run_event until the next ANALYZE: bench.trim's second fill of
-- 200,000 runs wrote 2,002 in its first minutes and none in the next 45. SPEC.md's rule is
-- that every lookup a function does is served by an index. A setting of the guard function
-- itself, so it holds for every writer and for the plan cached in each session, whichever
-- writer planned it first (pgtap/journal_lookups_by_index.sql). Its cost is a setting saved
-- and restored per journal row.

ALTER FUNCTION runrow._run_event_guard() SET enable_seqscan = off;
