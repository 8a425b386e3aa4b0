-- depends: 0025_wakes_only_for_waiters
-- agent_run's guard trigger called only when it has something to do, and its turn-order rule
-- checked once per UPDATE statement. The guard was a PL/pgSQL call for every updated row, the
-- largest part of the claim's and the finish's final statements (issue 11: about 45 us a row,
-- beside a few for the row's own write). Now:
-- - agent_run_guard has a WHEN clause that is true whenever the function could refuse the row
--   or change it: a terminal old row (sticky), an identity change, a status change outside
--   the lifecycle, or updated_at not yet now() (the function stamps it). A writer that sets
--   updated_at = now() itself on a legal change (the claim, finish_runs) skips the call; the
--   function is unchanged but for the turn-order rule, so it still decides whenever called.
-- - Turn order (no turn starts while an earlier turn of its conversation is queued) is checked
--   by an AFTER UPDATE statement trigger over the statement's old and new rows: one call and
--   one set-based probe per statement instead of one call per row. The statement fails with
--   40001 as the row check did, so a claim that collides still claims nothing that round.

CREATE OR REPLACE FUNCTION runrow._agent_run_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
BEGIN
    -- Invariant 2: terminal states are sticky. Nothing, not even the table owner,
    -- moves a row out of completed/failed/cancelled/dead or edits it. The one change
    -- allowed is trim_journal dropping the PII snapshot.
    IF OLD.status IN ('completed', 'failed', 'cancelled', 'dead') THEN
        IF NEW.request_snapshot IS NULL
           AND (to_jsonb(NEW) - 'request_snapshot' - 'updated_at')
               = (to_jsonb(OLD) - 'request_snapshot' - 'updated_at') THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'run % is % and terminal states are sticky', OLD.id, OLD.status
            USING ERRCODE = 'integrity_constraint_violation',
                  HINT = 'A terminal run can be run again only as a new run: runrow.retry_run().';
    END IF;
    -- Identity of a run never changes.
    IF NEW.id <> OLD.id
       OR NEW.conversation_id <> OLD.conversation_id
       OR NEW.user_message_id <> OLD.user_message_id
       OR NEW.prompt_id <> OLD.prompt_id
       OR NEW.model <> OLD.model
       OR NEW.created_at <> OLD.created_at
       OR NEW.enqueue_seq <> OLD.enqueue_seq THEN
        RAISE EXCEPTION 'run %: id, conversation, message, model, prompt and created_at are immutable', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    -- Status moves only along the lifecycle of SPEC.md.
    IF NEW.status <> OLD.status AND NOT (
        (OLD.status = 'queued' AND NEW.status IN ('running', 'cancelled'))
        -- A run of a tenant over its daily budget is not started: failed at claim, with why.
        OR (OLD.status = 'queued' AND NEW.status = 'failed' AND NEW.budget_exhausted IS NOT NULL)
        OR (OLD.status = 'running' AND NEW.status IN ('queued', 'waiting', 'completed', 'failed', 'cancelled', 'dead'))
        OR (OLD.status = 'waiting' AND NEW.status IN ('queued', 'cancelled'))
    ) THEN
        RAISE EXCEPTION 'run %: illegal status change % -> %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END
$fn$;

COMMENT ON FUNCTION runrow._agent_run_guard() IS
'agent_run''s BEFORE UPDATE row trigger (invariants 2 and the lifecycle): a terminal run is '
'sticky (only dropping request_snapshot is allowed), a run''s identity (id, conversation, '
'message, prompt, model, created_at, enqueue_seq) never changes, status moves only along SPEC.md''s '
'lifecycle (23000 otherwise), and updated_at is stamped now(). Its WHEN clause skips the call '
'only when none of that can apply: a non-terminal row, same identity, a legal or no status '
'change, updated_at already now(). Turn order is _agent_run_turn_order''s.';

CREATE FUNCTION runrow._agent_run_turn_order() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    bad record;
BEGIN
    -- Most statements start no run (a heartbeat, a finish): one look at their old rows.
    IF NOT EXISTS (SELECT 1 FROM old_runs AS o WHERE o.status = 'queued') THEN
        RETURN NULL;
    END IF;
    -- The earlier turns are read as "open" (agent_run_open_by_conversation) and tested for
    -- queued outside the query: a query on status = 'queued' can also be served by
    -- agent_run_claimable, which walks the whole queue ahead of the run (0009's header).
    SELECT n.id, n.conversation_id INTO bad
    FROM new_runs AS n
    JOIN old_runs AS o ON o.id = n.id
    WHERE n.status = 'running' AND o.status = 'queued'
      AND 'queued' = ANY (ARRAY(
          SELECT earlier.status FROM runrow.agent_run AS earlier
          WHERE earlier.conversation_id = n.conversation_id
            AND earlier.status IN ('queued', 'running', 'waiting')
            AND earlier.enqueue_seq < n.enqueue_seq
      ))
    LIMIT 1;
    IF FOUND THEN
        -- 40001: a concurrent enqueue committed an earlier turn after the claimer's
        -- snapshot; the claim treats it like any serialization failure and retries later.
        RAISE EXCEPTION 'run %: an earlier turn of conversation % is still queued', bad.id, bad.conversation_id
            USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN NULL;
END
$fn$;

REVOKE ALL ON FUNCTION runrow._agent_run_turn_order() FROM PUBLIC;

COMMENT ON FUNCTION runrow._agent_run_turn_order() IS
'agent_run''s AFTER UPDATE statement trigger (turn order): the statement fails with 40001 if '
'any run it moved from queued to running has an earlier turn of its conversation still queued '
'(read after the statement''s own writes, with a fresh snapshot), so a turn never starts before '
'an earlier one, whoever writes the table.';

DROP TRIGGER agent_run_guard ON runrow.agent_run;
CREATE TRIGGER agent_run_guard
BEFORE UPDATE ON runrow.agent_run
FOR EACH ROW
WHEN (
    old.status IN ('completed', 'failed', 'cancelled', 'dead')
    OR new.updated_at <> now()
    OR new.id <> old.id
    OR new.conversation_id <> old.conversation_id
    OR new.user_message_id <> old.user_message_id
    OR new.prompt_id <> old.prompt_id
    OR new.model <> old.model
    OR new.created_at <> old.created_at
    OR new.enqueue_seq <> old.enqueue_seq
    OR (new.status <> old.status AND NOT (
        (old.status = 'queued' AND new.status IN ('running', 'cancelled'))
        OR (old.status = 'queued' AND new.status = 'failed' AND new.budget_exhausted IS NOT NULL)
        OR (old.status = 'running' AND new.status IN ('queued', 'waiting', 'completed', 'failed', 'cancelled', 'dead'))
        OR (old.status = 'waiting' AND new.status IN ('queued', 'cancelled'))
    ))
)
EXECUTE FUNCTION runrow._agent_run_guard();

CREATE TRIGGER agent_run_turn_order
AFTER UPDATE ON runrow.agent_run
REFERENCING OLD TABLE AS old_runs NEW TABLE AS new_runs
FOR EACH STATEMENT EXECUTE FUNCTION runrow._agent_run_turn_order();
