-- depends: 0023_bounded_trim
-- The journal's delete rule (only a terminal run's journal may go) checked once per DELETE
-- statement over the runs it touched, not once per row: a trim deletes every row of each
-- ended run (26 for a streamed answer), and the per-row check of the same run's status was
-- about three quarters of trim_journal's CPU (bench/trim.py). The row trigger keeps INSERT
-- (seq) and UPDATE (append-only); an AFTER DELETE statement trigger with the deleted rows as
-- a transition table refuses the whole statement if any of their runs is not terminal.

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
    END IF;
    RAISE EXCEPTION 'run_event is append-only: rows cannot be updated'
        USING ERRCODE = 'integrity_constraint_violation';
END
$fn$;

COMMENT ON FUNCTION runrow._run_event_guard() IS
'run_event''s BEFORE INSERT OR UPDATE row trigger (invariant 4). INSERT: a NULL seq is assigned '
'the run''s next one (its last seq + 1, counting rows inserted earlier by the same statement; '
'writers leave it NULL and read it back with RETURNING); an explicit seq that is not the next one '
'raises 23000, so no gap or reuse even for the owner. UPDATE always raises 23000 (append-only). '
'Deletes are _run_event_delete_guard''s.';

CREATE FUNCTION runrow._run_event_delete_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    live uuid;
BEGIN
    SELECT g.run_id INTO live
    FROM (SELECT DISTINCT d.run_id FROM deleted_events AS d) AS g
    WHERE NOT EXISTS (
        SELECT 1 FROM runrow.agent_run AS r
        WHERE r.id = g.run_id AND r.status IN ('completed', 'failed', 'cancelled', 'dead')
    )
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'run_event is append-only: the journal of run % is still live', live
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END
$fn$;

REVOKE ALL ON FUNCTION runrow._run_event_delete_guard() FROM PUBLIC;

COMMENT ON FUNCTION runrow._run_event_delete_guard() IS
'run_event''s AFTER DELETE statement trigger: the statement fails with 23000, deleting nothing, '
'if any run whose journal rows it deleted is not terminal (only trim_journal''s deletes pass).';

DROP TRIGGER run_event_guard ON runrow.run_event;
CREATE TRIGGER run_event_guard
BEFORE INSERT OR UPDATE ON runrow.run_event
FOR EACH ROW EXECUTE FUNCTION runrow._run_event_guard();

CREATE TRIGGER run_event_delete_guard
AFTER DELETE ON runrow.run_event
REFERENCING OLD TABLE AS deleted_events
FOR EACH STATEMENT EXECUTE FUNCTION runrow._run_event_delete_guard();
