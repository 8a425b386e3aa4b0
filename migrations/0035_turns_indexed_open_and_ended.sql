-- depends: 0034_agent_run_settings_checked_when_set
-- A conversation's turns indexed in two parts, the open ones and the ended ones, instead of
-- all of them in one index (issue 11: WAL and index inserts per lifecycle).
--
-- Why: a claim cannot be a HOT update, so its new row version enters every index whose
-- predicate it meets. agent_run_conversation_turn (conversation_id, enqueue_seq) had none: the
-- enqueue, the claim and the finish each paid an insert for it (80 bytes of WAL and a B-tree
-- descent), beside agent_run_open_by_conversation, which the enqueue and the claim pay for
-- anyway. Split by status, a run enters the open part while it is queued, running or waiting
-- and the ended part once it ends: the claim pays one index insert fewer, the enqueue too.
--
-- - agent_run_open_by_conversation (conversation_id, enqueue_seq) WHERE queued/running/waiting,
--   as before, now UNIQUE;
-- - agent_run_ended_by_conversation (conversation_id, enqueue_seq) WHERE
--   completed/failed/cancelled/dead, UNIQUE.
--
-- A conversation's turns stay totally ordered: enqueue_seq is an identity column (GENERATED
-- ALWAYS), and a run forced to another's place is refused by the part it is in. The readers of
-- all of a conversation's turns (conversation_history, fork_run, get_conversation, audit())
-- read the two parts, each through its index.
--
-- Measured (one session draining 3,000 runs, pg_waldump): see the commit message.

ALTER TABLE runrow.agent_run DROP CONSTRAINT agent_run_conversation_turn;

DROP INDEX runrow.agent_run_open_by_conversation;
CREATE UNIQUE INDEX agent_run_open_by_conversation ON runrow.agent_run (conversation_id, enqueue_seq)
WHERE status IN ('queued', 'running', 'waiting');

CREATE UNIQUE INDEX agent_run_ended_by_conversation ON runrow.agent_run (conversation_id, enqueue_seq)
WHERE status IN ('completed', 'failed', 'cancelled', 'dead');

COMMENT ON INDEX runrow.agent_run_open_by_conversation IS
'A conversation''s open (queued, running, waiting) turns in turn order; with '
'agent_run_ended_by_conversation, every turn of a conversation (migration 0035).';

COMMENT ON INDEX runrow.agent_run_ended_by_conversation IS
'A conversation''s ended turns in turn order (the history conversation_history rebuilds); with '
'agent_run_open_by_conversation, every turn of a conversation (migration 0035).';
