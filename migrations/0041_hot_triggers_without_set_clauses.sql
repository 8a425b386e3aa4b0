-- depends: 0040_finished_runs_indexed_untrimmed_and_trimmed
-- The trigger functions that fire on every lifecycle write carry no SET clause (issue 11:
-- backend CPU per run).
--
-- A function with a SET clause is called through fmgr_security_definer: every call opens a
-- GUC nesting level, sets search_path, and restores it on exit. For a row trigger that is per
-- row: run_event_guard fires on every journal row (two to four per run in a drain), and the
-- save and restore was about 9,000 instructions a call, more than the trigger's own lookup
-- plan costs to run.
--
-- Safe without it: none of these functions is SECURITY DEFINER (a trigger runs as whoever
-- wrote the row), every runrow name they use is qualified, and everything else they name is in
-- pg_catalog, which PostgreSQL searches first whatever the search_path unless the path lists it
-- explicitly later. The writers that fire them are runrow's SECURITY DEFINER functions, which
-- pin search_path = pg_catalog, runrow themselves; a direct write by the owner fires them
-- under the owner's own path (pgtap/trigger_functions.sql runs them under an empty one).
--
-- The functions that only raise (no_delete, no_truncate, the immutability guards) and the
-- ones gated by a WHEN that an ordinary write does not meet keep their clause: they cost
-- nothing on the paths that matter.
--
-- Measured: see the commit message.

ALTER FUNCTION runrow._run_event_guard() RESET search_path;
ALTER FUNCTION runrow._agent_run_after_update() RESET search_path;
ALTER FUNCTION runrow._agent_run_settings() RESET search_path;
ALTER FUNCTION runrow._run_owner_guard() RESET search_path;
ALTER FUNCTION runrow._agent_step_guard() RESET search_path;
ALTER FUNCTION runrow._tool_effect_guard() RESET search_path;
