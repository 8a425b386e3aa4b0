-- Fork (issue 15): a run can start a new conversation whose history is another run's, up to one
-- of its steps. The copy keeps the record honest about where it came from: each run fork_run
-- writes points at the run it copies and says how many of its steps it copied, so a reader of
-- the new conversation can tell copied steps (seq <= forked_at_seq) from steps the fork made.
-- depends: 0015_queue_metrics

-- Nullable, no default: a catalog change, no rewrite of agent_run.
ALTER TABLE runrow.agent_run
ADD COLUMN forked_from uuid REFERENCES runrow.agent_run (id),
ADD COLUMN forked_at_seq integer CHECK (forked_at_seq >= 0),
ADD CONSTRAINT agent_run_fork_names_its_step CHECK ((forked_from IS NULL) = (forked_at_seq IS NULL));

COMMENT ON COLUMN runrow.agent_run.forked_from IS
'The run this run is a copy of (runrow.fork_run), NULL otherwise. Its steps 1..forked_at_seq '
'are that run''s steps, copied verbatim; later steps are the fork''s own.';

COMMENT ON COLUMN runrow.agent_run.forked_at_seq IS
'How many of forked_from''s steps were copied into this run (0: only its user message).';
