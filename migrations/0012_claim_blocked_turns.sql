-- A claim's cost must depend on what it claims, not on the queue behind it. The claim walks
-- agent_run_claimable in enqueue order and skips every turn that waits behind an active or
-- earlier turn of its conversation; when every conversation with queued turns already has a
-- running one, a claim that finds nothing walked the whole queue (measured: 10 000 blocked
-- turns, 67 630 buffers per empty claim, on every idle wake of every worker; with the mark, 30,
-- and 2 once vacuum has run; marking costs about 37 buffers per turn, once).
--
-- claim_blocked marks a queued turn that a claim found waiting behind another turn of its
-- conversation, and agent_run_claimable leaves it out, so later claims never read it again.
-- It is a filter, not an invariant: the unique index of invariant 1 and the turn-order check
-- of the guard trigger stay the guarantee, and a turn wrongly left unmarked only costs a
-- claim a probe. The one thing that must never happen is a mark that outlives its reason (the
-- turn would never be claimed), so:
--   - enqueue and retry insert turns unmarked (the default) and never decide it;
--   - the claim marks a turn only under its row lock (FOR UPDATE SKIP LOCKED), after
--     re-checking with a fresh snapshot that the turn is still blocked;
--   - when a turn leaves the open set (queued, running, waiting -> terminal), the trigger
--     below locks the conversation's next open turn FOR KEY SHARE (which the claim's FOR
--     UPDATE conflicts with) and clears its mark. Either the claim marked it first (the
--     trigger waits for that commit, then clears it) or the trigger holds the lock first
--     (the claim skips the row, and its next look sees the ended turn).
-- A running turn that goes back to queued (reaper, release, approval) was claimed unmarked
-- and stays so. audit() reports a marked turn with nothing ahead of it.
-- depends: 0011_interrupted_tool_calls

ALTER TABLE runrow.agent_run ADD COLUMN claim_blocked boolean NOT NULL DEFAULT false;

COMMENT ON COLUMN runrow.agent_run.claim_blocked IS
'A queued turn that a claim found waiting behind an active or earlier turn of its '
'conversation; left out of agent_run_claimable until that turn ends. Written only by the claim '
'(set) and the agent_run_unblock_next_turn trigger (cleared).';

-- Same name and key as before, so the claim's walk and its plan do not change; only the
-- blocked turns leave it. Built within the migration's transaction: the queue is small.
DROP INDEX runrow.agent_run_claimable;
CREATE INDEX agent_run_claimable ON runrow.agent_run (enqueue_seq)
WHERE status = 'queued' AND NOT claim_blocked;

CREATE FUNCTION runrow._unblock_next_turn() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    nxt record;
    marked boolean;
BEGIN
    -- The conversation's oldest open turn after this one ended. Only a turn younger than the
    -- ended one can have been waiting on it (an older open turn was ahead of it all along), so
    -- locks are taken in turn order, the order stop_conversation takes them in.
    SELECT n.id, n.enqueue_seq, n.status INTO nxt
    FROM runrow.agent_run AS n
    WHERE n.conversation_id = NEW.conversation_id
      AND n.status IN ('queued', 'running', 'waiting')
    ORDER BY n.enqueue_seq
    LIMIT 1;
    IF NOT FOUND OR nxt.status <> 'queued' OR nxt.enqueue_seq < NEW.enqueue_seq THEN
        RETURN NULL;
    END IF;
    -- Locked even when unmarked: a claim that read this turn as blocked before we ended the
    -- previous one must not mark it after we looked (it locks FOR UPDATE SKIP LOCKED).
    SELECT n.claim_blocked INTO marked FROM runrow.agent_run AS n
    WHERE n.id = nxt.id AND n.status = 'queued'
    FOR KEY SHARE;
    IF marked THEN
        UPDATE runrow.agent_run AS n SET claim_blocked = false WHERE n.id = nxt.id;
    END IF;
    RETURN NULL;
END
$fn$;

REVOKE ALL ON FUNCTION runrow._unblock_next_turn() FROM PUBLIC;

CREATE TRIGGER agent_run_unblock_next_turn
AFTER UPDATE OF status ON runrow.agent_run
FOR EACH ROW
WHEN (
    old.status IN ('queued', 'running', 'waiting')
    AND new.status IN ('completed', 'failed', 'cancelled', 'dead')
)
EXECUTE FUNCTION runrow._unblock_next_turn();
