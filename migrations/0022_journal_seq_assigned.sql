-- One lookup of a run's last seq per journal row (issue 11). Every writer computed
-- coalesce(max(seq), 0) + n and the guard trigger looked the same max up again to check it:
-- two backward scans of run_event_pkey per row. Now the guard assigns the next seq when the
-- writer leaves it NULL (writers read it back with RETURNING), and still refuses an explicit
-- seq that is not the next one, so invariant 4 holds for anyone writing the table, the owner
-- included. seq stays NOT NULL: BEFORE ROW triggers run before the NOT NULL check.
--
-- Measured (tests/test_journal_seq_cost.py): see the commit message.
-- depends: 0021_index_diet

CREATE OR REPLACE FUNCTION runrow._run_event_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    expected bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- Invariant 4: seq is the next one, no gap, no reuse. Rows inserted earlier by
        -- the same statement are visible here, so multi-row appends work, in the order
        -- the statement inserts them.
        SELECT coalesce(max(e.seq), 0) + 1 INTO expected
        FROM runrow.run_event AS e WHERE e.run_id = NEW.run_id;
        IF NEW.seq IS NULL THEN
            NEW.seq := expected;
        ELSIF NEW.seq <> expected THEN
            RAISE EXCEPTION 'run_event seq % for run % is out of order: expected %', NEW.seq, NEW.run_id, expected
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RETURN NEW;
    ELSIF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'run_event is append-only: rows cannot be updated'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    -- DELETE: only the journal of a terminal run may go (trim_journal).
    IF NOT EXISTS (
        SELECT 1 FROM runrow.agent_run AS r
        WHERE r.id = OLD.run_id AND r.status IN ('completed', 'failed', 'cancelled', 'dead')
    ) THEN
        RAISE EXCEPTION 'run_event is append-only: the journal of run % is still live', OLD.run_id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN OLD;
END
$fn$;

COMMENT ON FUNCTION runrow._run_event_guard() IS
'run_event''s BEFORE INSERT OR UPDATE OR DELETE row trigger (invariant 4). INSERT: a NULL seq '
'is assigned the run''s next one (its last seq + 1, counting rows inserted earlier by the same '
'statement; writers leave it NULL and read it back with RETURNING); an explicit seq that is not '
'the next one raises 23000, so no gap or reuse even for the owner. UPDATE always raises 23000 '
'(append-only). DELETE raises 23000 unless the run is terminal (trim_journal).';
