-- The usage and stop_reason of each model turn, kept with the step (issue 5: "each
-- completed model turn is appended with append_step: the content blocks exactly as
-- received, usage and the request id"). Cost accounting and audits read them from the
-- durable log, not from the journal, which is trimmed.
-- depends: 0006_untrimmed_journal_index

ALTER TABLE runrow.agent_step
ADD COLUMN usage jsonb CHECK (usage IS NULL OR jsonb_typeof(usage) = 'object'),
ADD COLUMN stop_reason text CHECK (stop_reason <> '' AND length(stop_reason) <= 64),
ADD CONSTRAINT agent_step_usage_only_on_model_turns CHECK (
    kind = 'model_turn' OR (usage IS NULL AND stop_reason IS NULL)
);

-- append_step gains two optional arguments; the old signature goes (when an earlier
-- migrate created it) so that the file in
-- functions/ defines the only one.
DROP FUNCTION IF EXISTS runrow.append_step(uuid, uuid, text, json, text);
DROP FUNCTION IF EXISTS runrow._append_step(uuid, text, json, text);
