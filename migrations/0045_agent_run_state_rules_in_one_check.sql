-- depends: 0044_agent_run_identity_by_column
-- agent_run's six row rules on status, attempt, claim and finish are one CHECK constraint,
-- agent_run_state, whose expression is one call of an IMMUTABLE PL/pgSQL function (issue 11:
-- the fixed cost of every statement that writes agent_run).
--
-- Why: PostgreSQL keeps a CHECK's expression as node text (pg_constraint.conbin) and, for
-- every INSERT or UPDATE statement, reads it back (stringToNode, about 26 instructions a
-- character) and compiles it before the first row. The six CHECKs were 6,576 characters,
-- about a tenth of a batch-1 claim or ending (python -m bench.instructions), however few rows
-- the statement wrote. One call of seven columns is about 1,000 characters; the function's
-- own expressions are compiled once per session, and each row then pays one function call.
--
-- The rules, their order and their errors are those of the six constraints: PostgreSQL checks
-- a table's CHECKs in the order of their names, and the function tests them in that order
-- (each once, as the six CHECKs did), raising 23514 with the same message and constraint
-- name (CONSTRAINT field) that the failing constraint raised. A rule's NULL passes, as in a
-- CHECK. The constraint stays in the schema: \d runrow.agent_run shows it, the function's
-- body is the rules' text, and audit() reports the constraint missing, invalid or disabled.
--
-- Added NOT VALID here and validated by 0046 in a transaction of its own: ADD CONSTRAINT
-- takes ACCESS EXCLUSIVE, but only NOT VALID skips the scan that would hold it over the
-- whole table; VALIDATE CONSTRAINT scans under SHARE UPDATE EXCLUSIVE, beside running
-- workers. A NOT VALID constraint binds every row written from the moment it is added, and
-- the rows already there met the six constraints it replaces.
--
-- Measured with python -m bench.instructions: see the commit message.

CREATE FUNCTION runrow._agent_run_state_valid(
    status text,
    attempt integer,
    max_attempts integer,
    claim_token uuid,
    worker_id text,
    claim_expires_at timestamptz,
    finished_at timestamptz
) RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $fn$
DECLARE
    broken text;
BEGIN
    -- The first broken rule, in the order of the constraint names (PostgreSQL's order); NULL
    -- for a valid row, which evaluates each rule once, as the six CHECKs did. A rule whose
    -- value is NULL passes, as in a CHECK.
    broken := CASE
        WHEN NOT coalesce(attempt >= 0 AND attempt <= max_attempts, TRUE)
            THEN 'agent_run_attempt_range'
        WHEN NOT coalesce((status = 'running') = (
            claim_token IS NOT NULL AND worker_id IS NOT NULL AND claim_expires_at IS NOT NULL
        ), TRUE)
            THEN 'agent_run_claim_iff_running'
        WHEN NOT coalesce((status IN ('completed', 'failed', 'cancelled', 'dead')) = (finished_at IS NOT NULL), TRUE)
            THEN 'agent_run_finished_iff_terminal'
        WHEN NOT coalesce(status = 'running' OR (claim_token IS NULL AND claim_expires_at IS NULL), TRUE)
            THEN 'agent_run_no_claim_unless_running'
        WHEN NOT coalesce(status <> 'running' OR attempt >= 1, TRUE)
            THEN 'agent_run_running_has_attempt'
        WHEN NOT coalesce(status IN ('queued', 'running', 'waiting', 'completed', 'failed', 'cancelled', 'dead'), TRUE)
            THEN 'agent_run_status_check'
    END;
    IF broken IS NULL THEN
        RETURN TRUE;
    END IF;
    RAISE EXCEPTION 'new row for relation "agent_run" violates check constraint "%"', broken
        USING ERRCODE = 'check_violation', CONSTRAINT = broken, TABLE = 'agent_run', SCHEMA = 'runrow';
END
$fn$;

REVOKE ALL ON FUNCTION runrow._agent_run_state_valid(
    text, integer, integer, uuid, text, timestamptz, timestamptz
) FROM PUBLIC;

COMMENT ON FUNCTION runrow._agent_run_state_valid(
    text, integer, integer, uuid, text, timestamptz, timestamptz
) IS
'The expression of agent_run''s CHECK constraint agent_run_state: TRUE when the row meets the six '
'rules (attempt_range: 0 <= attempt <= max_attempts; claim_iff_running: running exactly when '
'claim_token, worker_id and claim_expires_at are all set; finished_iff_terminal: finished_at set '
'exactly when the status is terminal; no_claim_unless_running: no token or lease unless running; '
'running_has_attempt: a running run is at attempt 1 or more; status_check: a known status), a '
'rule whose value is NULL passing as in a CHECK. Otherwise it raises 23514 naming the first '
'broken rule, in name order, as agent_run_<rule>, with the message PostgreSQL gives a failed '
'CHECK. IMMUTABLE: it reads its arguments only.';

ALTER TABLE runrow.agent_run
ADD CONSTRAINT agent_run_state CHECK (
    runrow._agent_run_state_valid(
        status, attempt, max_attempts, claim_token, worker_id, claim_expires_at, finished_at
    )
) NOT VALID,
DROP CONSTRAINT agent_run_attempt_range,
DROP CONSTRAINT agent_run_claim_iff_running,
DROP CONSTRAINT agent_run_finished_iff_terminal,
DROP CONSTRAINT agent_run_no_claim_unless_running,
DROP CONSTRAINT agent_run_running_has_attempt,
DROP CONSTRAINT agent_run_status_check;
