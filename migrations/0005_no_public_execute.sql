-- PUBLIC may execute no function in schema runrow. 0001's
-- `ALTER DEFAULT PRIVILEGES IN SCHEMA runrow REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC` is a
-- no-op: a per-schema default can only add to the global default, which grants EXECUTE to
-- PUBLIC. The files in functions/ revoke their own, but the trigger functions the
-- migrations create (_agent_run_guard, _run_event_guard, ...) were left executable by
-- PUBLIC. A migration that adds a function must REVOKE it from PUBLIC itself;
-- pgtap/privileges.sql fails when one does not.
-- depends: 0003_dba_views

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA runrow FROM PUBLIC;
