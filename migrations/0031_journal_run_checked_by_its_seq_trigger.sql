-- depends: 0030_no_before_update_row_triggers
-- A journal row's run is checked by the journal's own seq trigger, not by a foreign key
-- (issue 11: WAL and CPU per journal row).
--
-- Why: the foreign key run_event.run_id -> agent_run.id checks every inserted journal row with
-- a query of its own (PostgreSQL's RI trigger, through SPI) that key-share locks the run's row.
-- When the run's row was updated earlier in the transaction without a row lock (a finish, a
-- release, a reap: since 0030 no trigger locks it first), that lock is a WAL record of its own,
-- one per ended run. And the check it makes is one the seq trigger can make for free: it
-- already reads the run's last seq, and a run that has journal rows exists, because a run is
-- never deleted (agent_run_no_delete, agent_run_no_truncate) and its id never changes
-- (agent_run_guard). Only a run with no journal row yet (its enqueue, or after trim_journal) is
-- looked up, without a lock for the same reason.
--
-- Unchanged: a journal row for a run that does not exist is refused with 23503
-- (foreign_key_violation), naming the run; every other rule of _run_event_guard stays.
--
-- Measured: see the commit message.

ALTER TABLE runrow.run_event DROP CONSTRAINT run_event_run_id_fkey;

CREATE OR REPLACE FUNCTION runrow._run_event_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    last_seq bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- Invariant 4: seq is the next one, no gap, no reuse. Rows inserted earlier by
        -- the same statement are visible here, so multi-row appends work, in the order
        -- the statement inserts them.
        SELECT max(e.seq) INTO last_seq
        FROM runrow.run_event AS e WHERE e.run_id = NEW.run_id;
        -- A run with journal rows exists (runs are never deleted); one without is looked up
        -- (nested, so the common case runs no statement for it).
        IF last_seq IS NULL THEN
            IF NOT EXISTS (SELECT 1 FROM runrow.agent_run AS r WHERE r.id = NEW.run_id) THEN
                RAISE EXCEPTION 'run_event: run % does not exist', NEW.run_id
                    USING ERRCODE = 'foreign_key_violation';
            END IF;
        END IF;
        IF NEW.seq IS NULL THEN
            NEW.seq := coalesce(last_seq, 0) + 1;
        ELSIF NEW.seq <> coalesce(last_seq, 0) + 1 THEN
            RAISE EXCEPTION 'run_event seq % for run % is out of order: expected %',
                NEW.seq, NEW.run_id, coalesce(last_seq, 0) + 1
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'run_event is append-only: rows cannot be updated'
        USING ERRCODE = 'integrity_constraint_violation';
END
$fn$;

COMMENT ON FUNCTION runrow._run_event_guard() IS
'run_event''s BEFORE INSERT OR UPDATE row trigger (invariant 4, and the journal''s reference to '
'its run). INSERT: a row whose run does not exist raises 23503 (a run with journal rows exists: '
'runs are never deleted; one without is looked up); a NULL seq is assigned the run''s next one '
'(its last seq + 1, counting rows inserted earlier by the same statement; writers leave it NULL '
'and read it back with RETURNING); an explicit seq that is not the next one raises 23000, so no '
'gap or reuse even for the owner. UPDATE always raises 23000 (append-only). Deletes are '
'_run_event_delete_guard''s.';
