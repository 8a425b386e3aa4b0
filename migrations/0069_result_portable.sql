-- depends: 0068_queue_metrics_alertable
-- A run's result must be JSON every client can read back, as its metadata, content and tools
-- have had to be since issue 11's SQL audit: fewer than 100 levels deep, and no number beyond a
-- double's range. The finish functions checked only its size. A worker that ended a run with a
-- result nested 3,000 deep (or holding 1e400) wrote it, and then:
-- - its webhook payload could not be decoded by the sender (Python's json gives up near 1,000
--   levels), after the claim had leased it and the deliveries claimed beside it, so every
--   attempt lapsed them all and all were dead-lettered with nothing sent;
-- - GET /runs/{id} and `runrow show` could not read the run back.
-- finish_run, finish_runs and finish_and_claim_runs now refuse such a result (22023 naming it),
-- and the table refuses it too: agent_run_result_portable. A result written before this
-- migration is left as it is (NOT VALID); the webhook sender reads such a payload apart from the
-- rest of its batch.
--
-- The CHECK calls runrow._agent_run_result_ok, defined here because the CHECK needs it to exist
-- when the migration runs. Its body calls runrow._json_portable (functions/_request_checks.sql,
-- the one place the rule is written), which PL/pgSQL looks up only when the body first runs:
-- an existing install has it from functions/, and a fresh one has no row to check before
-- functions/ is applied after the migrations.

-- The CHECK calls a PL/pgSQL function, which is never inlined: PostgreSQL compiles every
-- CHECK of agent_run once per UPDATE statement, claims and heartbeats included (0034, 0045),
-- and an inlined _json_portable is parsed and planned there each time (measured: +172,621
-- backend instructions per finish_and_claim_runs call, +6,053 per run). The function's own
-- expression is planned once per session. `result IS NULL` is tested first, so a claim or a
-- heartbeat calls nothing.
CREATE FUNCTION runrow._agent_run_result_ok(result jsonb)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $fn$
BEGIN
    RETURN runrow._json_portable(result);
END
$fn$;

COMMENT ON FUNCTION runrow._agent_run_result_ok(jsonb) IS
'Private. agent_run_result_portable''s test: _json_portable(result), behind a PL/pgSQL call so '
'that the CHECK compiled on every UPDATE of agent_run does not inline it.';

REVOKE ALL ON FUNCTION runrow._agent_run_result_ok(jsonb) FROM PUBLIC;

ALTER TABLE runrow.agent_run
ADD CONSTRAINT agent_run_result_portable CHECK (result IS NULL OR runrow._agent_run_result_ok(result)) NOT VALID;

COMMENT ON CONSTRAINT agent_run_result_portable ON runrow.agent_run IS
'A run''s result is JSON every client can read back (runrow._json_portable: under 100 levels, '
'numbers within a double''s range). NOT VALID: results written before migration 0069 stay.';
