-- depends: 0107_key_error_other_answerer
-- A model turn's ending beyond its stop_reason is kept beside its step, in agent_step_ending:
-- stop_sequence (which of the run's stop_sequences fired) and stop_details (a refusal's details,
-- as the provider sent them).
--
-- Why: they were kept only in the turn's model_turn journal event, and a worker that ended a run
-- on a turn it did not make (a resumed attempt, a fork: fork_run copies steps, not events) read
-- them back by walking the journal, the source's for a fork. trim_journal deletes a finished
-- run's events (every worker's reaper, after 24 h by default), so a fork of a run finished more
-- than a day ago, the usual fork, ended without them. Steps are never trimmed, and neither is
-- this table; fork_run and retry_run copy it with the steps (_copy_steps).
--
-- A side table, not two agent_step columns: with any new column on agent_step every append_step
-- cost about 45 % more backend instructions (694,751 -> ~1,011,000, bench.api_calls), endings or
-- not. A row here is written only for a turn that has one (append_step's stop_sequence or
-- stop_details given), so the normal append pays nothing. Steps written before this migration
-- have none: the journal they were in may be gone, so nothing backfills them.
--
-- Append-only like agent_step (whose rows are never deleted, so no cascade is needed): UPDATE,
-- DELETE and TRUNCATE raise. Only the auditor reads it; the API writes it (invariant 6).

CREATE TABLE runrow.agent_step_ending (
    run_id uuid NOT NULL,
    seq integer NOT NULL,
    stop_sequence text,
    stop_details jsonb,
    PRIMARY KEY (run_id, seq),
    FOREIGN KEY (run_id, seq) REFERENCES runrow.agent_step (run_id, seq),
    CONSTRAINT agent_step_ending_stop_sequence CHECK (
        stop_sequence <> '' AND length(stop_sequence) <= 4096
    ),
    CONSTRAINT agent_step_ending_stop_details CHECK (
        jsonb_typeof(stop_details) = 'object' AND octet_length(stop_details::text) <= 65536
    ),
    CONSTRAINT agent_step_ending_not_empty CHECK (
        stop_sequence IS NOT NULL OR stop_details IS NOT NULL
    )
);

COMMENT ON TABLE runrow.agent_step_ending IS
'How a model_turn step ended beyond its stop_reason, one row per step that has either field '
'(migration 0108): stop_sequence, the one of the run''s stop_sequences the model met (1 to 4096 '
'characters), and stop_details as the provider sent them (a refusal''s {type, category, '
'explanation}: a JSON object of at most 64 KiB). Written by append_step, read by get_step, '
'copied with the steps by fork_run and retry_run. Append-only (triggers refuse UPDATE, DELETE '
'and TRUNCATE); trim_journal never touches it. Steps written before migration 0108 have no row.';

CREATE FUNCTION runrow._agent_step_ending_append_only() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
    RAISE EXCEPTION 'agent_step_ending is append-only: rows cannot be %d', lower(TG_OP)
        USING ERRCODE = 'integrity_constraint_violation',
              HINT = 'A step''s ending is part of the step, which is never changed.';
END
$fn$;

COMMENT ON FUNCTION runrow._agent_step_ending_append_only() IS
'agent_step_ending''s BEFORE UPDATE OR DELETE statement trigger: every UPDATE and DELETE fails '
'with 23000, as agent_step''s do.';

REVOKE ALL ON FUNCTION runrow._agent_step_ending_append_only() FROM PUBLIC;

CREATE TRIGGER agent_step_ending_append_only BEFORE UPDATE OR DELETE ON runrow.agent_step_ending
FOR EACH STATEMENT EXECUTE FUNCTION runrow._agent_step_ending_append_only();

CREATE TRIGGER agent_step_ending_no_truncate BEFORE TRUNCATE ON runrow.agent_step_ending
FOR EACH STATEMENT EXECUTE FUNCTION runrow._no_truncate();

REVOKE ALL ON runrow.agent_step_ending FROM PUBLIC;
GRANT SELECT ON runrow.agent_step_ending TO runrow_auditor;

-- get_step returns two more columns: its old result type goes so that functions/get_step.sql
-- can create it (CREATE OR REPLACE cannot change a function's result type). append_step's older
-- form is dropped by its file in functions/, as set_model_price's are.
DROP FUNCTION IF EXISTS runrow.get_step(uuid, integer);
