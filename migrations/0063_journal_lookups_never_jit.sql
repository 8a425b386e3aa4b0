-- depends: 0062_journal_guard_reads_by_index
-- The journal guard never JIT-compiles its lookup of the run's last seq. After a trim that
-- empties the journal and a VACUUM, run_event's key keeps its pages (169,615 at 1,000,000 runs
-- trimmed) over a handful of rows, and the planner prices the lookup by that key at the
-- fraction of those pages one run's rows would fill: 174,190 for one row's lookup, above
-- jit_above_cost (100,000 by default). Migration 0062 kept the lookup on the key; the plan
-- then carried JIT, and PostgreSQL compiles a plan's expressions on every execution: every
-- journal row written (enqueue, claim, append, finish) paid an LLVM compilation, and
-- bench.trim's second fill of 1,000,000 runs wrote none of its first 1,000 in two minutes
-- (the first fill took about 1.2 s a thousand). A point lookup has nothing for JIT to speed up.
-- Until an ANALYZE sees the refilled journal, so any server with JIT on; the planner's
-- estimate, not the data, decides. A setting of the guard function itself, as 0062's
-- (tests/test_journal_lookups_never_jit.py).

ALTER FUNCTION runrow._run_event_guard() SET jit = off;
