-- depends: 0042_agent_run_rules_once_per_statement
-- _finish_runs_input returns each element's fields as parallel arrays (ids, tokens, statuses,
-- results, errors, events) in place of the elements keyed by id (byid): finish_runs and
-- finish_and_claim_runs join them to agent_run as rows instead of looking each field up in the
-- JSON by the run's id text (issue 11). A function's OUT columns cannot be changed in place, so
-- the old one goes here and functions/_finish_runs_input.sql creates the new one, as every
-- migrate re-applies functions/ after the migrations (its callers, in functions/ too, call it by
-- name at run time: nothing depends on it in the catalog). IF EXISTS: on a fresh install the
-- migrations run before functions/ has created it.

DROP FUNCTION IF EXISTS runrow._finish_runs_input(jsonb);
