-- The claim's per-conversation probe ("is there an earlier open turn of this conversation?")
-- must be served by exactly one index, whatever the statistics say. With the old
-- agent_run_queued_by_conversation (conversation_id, enqueue_seq) WHERE status = 'queued',
-- agent_run_claimable (enqueue_seq) WHERE status = 'queued' served the same probe too, and
-- with statistics taken while the queue was empty (both estimated at one row) the planner
-- picked the smaller one and walked the whole queue ahead of the candidate. A probe on
-- status IN ('queued', 'running', 'waiting') implies only this index's predicate, so it
-- cannot be served by the queue's index. Same size class as the old index (open runs only),
-- and it also serves enqueue_run's and stop_conversation's "open runs of this conversation".
-- depends: 0008_agent_run_autovacuum

CREATE INDEX agent_run_open_by_conversation
ON runrow.agent_run (conversation_id, enqueue_seq)
WHERE status IN ('queued', 'running', 'waiting');

DROP INDEX runrow.agent_run_queued_by_conversation;

-- The turn-order trigger's probe, reshaped the same way (its rule is unchanged).
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
        OR (OLD.status = 'running' AND NEW.status IN ('queued', 'waiting', 'completed', 'failed', 'cancelled', 'dead'))
        OR (OLD.status = 'waiting' AND NEW.status IN ('queued', 'cancelled'))
    ) THEN
        RAISE EXCEPTION 'run %: illegal status change % -> %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    -- Turn order: a turn starts only when no earlier turn of its conversation is still
    -- queued. The claim never picks such a turn; this makes it impossible. The earlier
    -- turns are read as "open" (agent_run_open_by_conversation) and tested for queued
    -- outside the query: a query on status = 'queued' can also be served by
    -- agent_run_claimable, which walks the whole queue ahead of the run (0009's header).
    IF NEW.status = 'running' AND OLD.status = 'queued' AND 'queued' = ANY (ARRAY(
        SELECT earlier.status FROM runrow.agent_run AS earlier
        WHERE earlier.conversation_id = NEW.conversation_id
          AND earlier.status IN ('queued', 'running', 'waiting')
          AND earlier.enqueue_seq < NEW.enqueue_seq
    )) THEN
        -- 40001: a concurrent enqueue committed an earlier turn after the claimer's
        -- snapshot; the claim treats it like any serialization failure and retries later.
        RAISE EXCEPTION 'run %: an earlier turn of conversation % is still queued', NEW.id, NEW.conversation_id
            USING ERRCODE = 'serialization_failure';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END
$fn$;
