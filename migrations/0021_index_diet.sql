-- depends: 0020_uuidv7_run_ids
-- An index diet for agent_run (issue 11). Neither claim nor finish can be a HOT update
-- (status is in the predicates of the partial indexes), so every index whose predicate the
-- new row version meets takes an insert: the enqueue, the claim and the finish each paid for
-- the two indexes below although no lookup needed both.
--
-- - agent_run_enqueue_seq_key (UNIQUE (enqueue_seq)): no statement looks a run up by
--   enqueue_seq alone or orders the whole table by it; the claim orders
--   agent_run_claimable, turn order reads agent_run_open_by_conversation. Uniqueness is
--   the identity column's (GENERATED ALWAYS: no insert chooses it, and the guard trigger
--   refuses to change it).
-- - agent_run_conversation_idx (conversation_id, created_at): every reader of a
--   conversation's runs (get_conversation, conversation_history, fork_run, stop_conversation)
--   orders them by enqueue_seq, not created_at. Replaced by agent_run_conversation_turn
--   UNIQUE (conversation_id, enqueue_seq), which serves those scans in their own order and
--   states in the schema that a conversation's turns are totally ordered.
--
-- Measured (bench.drain SQL API rows, 2,000 runs, fsync on): see the commit message.
ALTER TABLE runrow.agent_run DROP CONSTRAINT agent_run_enqueue_seq_key;
DROP INDEX runrow.agent_run_conversation_idx;
ALTER TABLE runrow.agent_run
ADD CONSTRAINT agent_run_conversation_turn UNIQUE (conversation_id, enqueue_seq);

COMMENT ON CONSTRAINT agent_run_conversation_turn ON runrow.agent_run IS
'A conversation''s turns are totally ordered by enqueue_seq; serves every per-conversation scan.';
