-- depends: 0046_agent_run_state_validated
-- run_event's three CHECKs (seq >= 1, type not empty, payload an object) are kept by its row
-- guard, _run_event_guard, which already runs for every journal row (issue 11: the fixed
-- cost of every statement that journals).
--
-- Why: PostgreSQL compiles a table's CHECKs from their node text for every INSERT statement
-- (0045 says how). The journal's three were 1,326 characters, read back and compiled by every
-- claim, append and ending, for one or two rows at batch 1. Two more tests in the trigger cost
-- a row a few hundred instructions more than the CHECK's own evaluation did.
--
-- The rules and their errors stay: an empty type or a payload that is not a JSON object raises
-- 23514 with the message and constraint name the CHECK raised (run_event_type_check,
-- run_event_payload_check), after the trigger's own rules, as the CHECKs ran after it. seq >= 1
-- needed no test of its own: the trigger assigns seq as the run's last + 1 and refuses any
-- other explicit seq (23000), so a seq below 1 never reached the CHECK. As in 0034, the rules
-- hold whoever writes the table, and audit() reports the trigger missing or disabled.
--
-- Measured with python -m bench.instructions: see the commit message.

CREATE OR REPLACE FUNCTION runrow._run_event_guard() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
DECLARE
    last_seq bigint;
    last_type text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- Invariant 4: seq is the next one, no gap, no reuse. Rows inserted earlier by
        -- the same statement are visible here, so multi-row appends work, in the order
        -- the statement inserts them.
        SELECT e.seq, e.type INTO last_seq, last_type
        FROM runrow.run_event AS e WHERE e.run_id = NEW.run_id
        ORDER BY e.seq DESC
        LIMIT 1;
        -- A run with journal rows exists (runs are never deleted); one without is looked up
        -- (nested, so the common case runs no statement for it).
        IF last_seq IS NULL THEN
            IF NOT EXISTS (SELECT 1 FROM runrow.agent_run AS r WHERE r.id = NEW.run_id) THEN
                RAISE EXCEPTION 'run_event: run % does not exist', NEW.run_id
                    USING ERRCODE = 'foreign_key_violation';
            END IF;
        ELSIF last_type = 'complete' THEN
            -- 23505, as the unique index that kept this rule before raised it.
            RAISE EXCEPTION 'run_event: run % already has its complete event (seq %); nothing is journaled after it',
                NEW.run_id, last_seq
                USING ERRCODE = 'unique_violation';
        END IF;
        IF NEW.seq IS NULL THEN
            NEW.seq := coalesce(last_seq, 0) + 1;
        ELSIF NEW.seq <> coalesce(last_seq, 0) + 1 THEN
            RAISE EXCEPTION 'run_event seq % for run % is out of order: expected %',
                NEW.seq, NEW.run_id, coalesce(last_seq, 0) + 1
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        -- The CHECKs' rules (0047), with their errors: one test for a valid row.
        IF NEW.type = '' OR jsonb_typeof(NEW.payload) <> 'object' THEN
            IF NEW.type = '' THEN
                RAISE EXCEPTION 'new row for relation "run_event" violates check constraint "run_event_type_check"'
                    USING ERRCODE = 'check_violation', CONSTRAINT = 'run_event_type_check',
                          TABLE = 'run_event', SCHEMA = 'runrow';
            END IF;
            RAISE EXCEPTION 'new row for relation "run_event" violates check constraint "run_event_payload_check"'
                USING ERRCODE = 'check_violation', CONSTRAINT = 'run_event_payload_check',
                      TABLE = 'run_event', SCHEMA = 'runrow';
        END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'run_event is append-only: rows cannot be updated'
        USING ERRCODE = 'integrity_constraint_violation';
END
$fn$;

COMMENT ON FUNCTION runrow._run_event_guard() IS
'run_event''s BEFORE INSERT OR UPDATE row trigger (invariant 4, the journal''s reference to its '
'run, one complete event per run, and the row''s own rules). INSERT: a row whose run does not '
'exist raises 23503 (a run with journal rows exists: runs are never deleted; one without is '
'looked up); a row after the run''s complete event raises 23505 (nothing is journaled after a '
'complete, so there is at most one); a NULL seq is assigned the run''s next one (its last seq + '
'1, counting rows inserted earlier by the same statement; writers leave it NULL and read it back '
'with RETURNING); an explicit seq that is not the next one raises 23000, so no gap or reuse even '
'for the owner, and no seq below 1; then an empty type or a payload that is not a JSON object '
'raises 23514 as the CHECKs run_event_type_check and run_event_payload_check did (0047). UPDATE '
'always raises 23000 (append-only). Deletes are _run_event_delete_guard''s.';

ALTER TABLE runrow.run_event
DROP CONSTRAINT run_event_seq_check,
DROP CONSTRAINT run_event_type_check,
DROP CONSTRAINT run_event_payload_check;
