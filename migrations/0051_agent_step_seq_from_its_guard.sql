-- depends: 0050_prompt_reference_without_row_lock
-- A step's seq is assigned by agent_step's guard trigger when the writer leaves it NULL, as the
-- journal's has been since 0022 (issue 11: one lookup of a run's last step per step, not two).
--
-- Why: _append_step read the run's last seq to number the step, and the guard read it again to
-- check the number: two statements, each an executor start-up and a descent of agent_step_pkey,
-- per step. Now the writer leaves seq NULL and reads the guard's number back (RETURNING); the
-- guard's one lookup assigns it. An explicit seq is still checked, for every role: the next one
-- or 23000 (fork_run copies steps with theirs).
--
-- Unchanged: gap-free seqs from 1, append-only, tool_use_id derived from the payload.
--
-- Measured: see the commit message.

CREATE OR REPLACE FUNCTION runrow._agent_step_guard() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
DECLARE
    expected integer;
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- Invariant 4: the next seq, no gap, no reuse. A NULL seq is the writers' way: it is
        -- given the next one (0051).
        SELECT coalesce(max(s.seq), 0) + 1 INTO expected
        FROM runrow.agent_step AS s WHERE s.run_id = NEW.run_id;
        IF NEW.seq IS NULL THEN
            NEW.seq := expected;
        ELSIF NEW.seq <> expected THEN
            RAISE EXCEPTION 'agent_step seq % for run % is out of order: expected %', NEW.seq, NEW.run_id, expected
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        -- Derived, whatever the INSERT said, so it cannot disagree with the payload.
        NEW.tool_use_id := CASE
            WHEN NEW.kind = 'tool_result' THEN runrow._json_probe(NEW.payload) ->> 'tool_use_id'
        END;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'agent_step is append-only: rows cannot be %d', lower(TG_OP)
        USING ERRCODE = 'integrity_constraint_violation',
              HINT = 'Steps are the record of a run; a correction is a new step.';
END
$fn$;

COMMENT ON FUNCTION runrow._agent_step_guard() IS
'agent_step''s BEFORE INSERT OR UPDATE OR DELETE row trigger. INSERT: invariant 4, the run''s next '
'seq (its last + 1): a NULL seq is assigned it (the writers leave it NULL and read it back with '
'RETURNING, 0051), any other seq must be it or raises 23000; tool_use_id is derived from a '
'tool_result''s payload. UPDATE and DELETE always raise 23000 (append-only).';
