-- depends: 0032_no_index_of_running_runs_by_worker
-- agent_run_guard split in three, so an UPDATE compiles only the WHEN clauses of the rules it
-- can break (issue 11: the fixed cost of a one-run claim, finish or heartbeat).
--
-- Why: PostgreSQL compiles a row trigger's WHEN clause (reads its stored node tree back,
-- plans and prepares it) once per statement, and the guard's covered every rule: about 34 us
-- of every single-row UPDATE of agent_run, a heartbeat's included, a quarter of its cost
-- (measured: 125 -> 91 us per one-row update with the guard's WHEN gone). A column-gated
-- trigger (UPDATE OF ...) is skipped, WHEN and all, by a statement that does not assign one
-- of its columns. So:
--
-- - agent_run_guard: every UPDATE, WHEN the run was terminal (invariant 2, a short clause);
-- - agent_run_lifecycle_guard: UPDATE OF status, WHEN the status moves off SPEC.md's
--   lifecycle (only the statements that set status compile it: claims, endings, stops);
-- - agent_run_identity_guard: UPDATE OF the identity columns, WHEN one of them changes
--   (no runrow function assigns them, so none compiles it).
--
-- Same function, same messages and SQLSTATEs; a statement that breaks a rule still fails
-- before it can commit. Still AFTER triggers (migration 0030).
--
-- Measured (a PL/pgSQL loop of one-row updates; see the commit message).

DROP TRIGGER agent_run_guard ON runrow.agent_run;

CREATE TRIGGER agent_run_guard
AFTER UPDATE ON runrow.agent_run
FOR EACH ROW
WHEN (old.status IN ('completed', 'failed', 'cancelled', 'dead'))
EXECUTE FUNCTION runrow._agent_run_guard();

CREATE TRIGGER agent_run_lifecycle_guard
AFTER UPDATE OF status ON runrow.agent_run
FOR EACH ROW
WHEN (
    new.status <> old.status
    AND NOT (
        (old.status = 'queued' AND new.status IN ('running', 'cancelled'))
        OR (old.status = 'queued' AND new.status = 'failed' AND new.budget_exhausted IS NOT NULL)
        OR (old.status = 'running' AND new.status IN ('queued', 'waiting', 'completed', 'failed', 'cancelled', 'dead'))
        OR (old.status = 'waiting' AND new.status IN ('queued', 'cancelled'))
    )
)
EXECUTE FUNCTION runrow._agent_run_guard();

CREATE TRIGGER agent_run_identity_guard
AFTER UPDATE OF id, conversation_id, user_message_id, prompt_id, model, created_at, enqueue_seq
ON runrow.agent_run
FOR EACH ROW
WHEN (
    new.id <> old.id
    OR new.conversation_id <> old.conversation_id
    OR new.user_message_id <> old.user_message_id
    OR new.prompt_id <> old.prompt_id
    OR new.model <> old.model
    OR new.created_at <> old.created_at
    OR new.enqueue_seq <> old.enqueue_seq
)
EXECUTE FUNCTION runrow._agent_run_guard();

COMMENT ON FUNCTION runrow._agent_run_guard() IS
'agent_run''s AFTER UPDATE row trigger function (invariant 2 and the lifecycle), called by three '
'triggers whose WHEN clauses each name one rule: agent_run_guard (the run was terminal), '
'agent_run_lifecycle_guard (UPDATE OF status: a move off SPEC.md''s lifecycle) and '
'agent_run_identity_guard (UPDATE OF the identity columns: one changed). The statement fails '
'with 23000 if it edits a terminal run (only dropping request_snapshot is allowed), changes a '
'run''s identity (id, conversation, message, prompt, model, created_at, enqueue_seq) or moves a '
'status off the lifecycle. Writers stamp updated_at themselves (migration 0030).';
