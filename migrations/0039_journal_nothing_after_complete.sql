-- depends: 0038_claimed_run_type
-- "One complete event per run" is kept by the journal's seq trigger, as "nothing is journaled
-- after a run's complete event", not by the unique index run_event_one_complete (issue 11: WAL
-- and CPU per run).
--
-- Why: every ended run paid one more B-tree leaf insert (and its WAL record) into
-- run_event_one_complete, for a rule the seq trigger can check for free: it already reads the
-- run's last journal row to number the next one, and reading that row's type beside its seq
-- costs the same index probe. A complete is the last event of its run by construction (every
-- writer ends a run with it, and a run that has ended is fenced out of its journal), so "the
-- last row is not a complete" is the stronger rule: no second complete, and no event after one.
--
-- Concurrent writers: two transactions that both append to one run read the same last seq and
-- write the same next one, so run_event_pkey makes the second wait for the first and then fail
-- (23505), whatever their types; a writer that starts after a complete committed sees it and is
-- refused. The rule stays visible to a DBA in the trigger, and audit() still reports
-- multiple_complete_events for rows written with the trigger disabled.
--
-- read_events finds the journal's own complete as its last row (the index was how it looked
-- it up).
--
-- Measured: see the commit message.

DROP INDEX runrow.run_event_one_complete;

CREATE OR REPLACE FUNCTION runrow._run_event_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
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
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'run_event is append-only: rows cannot be updated'
        USING ERRCODE = 'integrity_constraint_violation';
END
$fn$;

COMMENT ON FUNCTION runrow._run_event_guard() IS
'run_event''s BEFORE INSERT OR UPDATE row trigger (invariant 4, the journal''s reference to its '
'run, and one complete event per run). INSERT: a row whose run does not exist raises 23503 (a '
'run with journal rows exists: runs are never deleted; one without is looked up); a row after '
'the run''s complete event raises 23505 (nothing is journaled after a complete, so there is at '
'most one); a NULL seq is assigned the run''s next one (its last seq + 1, counting rows inserted '
'earlier by the same statement; writers leave it NULL and read it back with RETURNING); an '
'explicit seq that is not the next one raises 23000, so no gap or reuse even for the owner. '
'UPDATE always raises 23000 (append-only). Deletes are _run_event_delete_guard''s.';
