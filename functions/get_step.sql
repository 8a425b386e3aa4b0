CREATE OR REPLACE FUNCTION runrow.get_step(run_id uuid, seq integer)
RETURNS TABLE (
    kind text,
    stop_reason text,
    usage jsonb,
    request_id text,
    stop_sequence text,
    stop_details jsonb,
    attempt integer,
    created_at timestamptz
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    PERFORM runrow._require_not_null(get_step.run_id, 'run_id');
    PERFORM runrow._require_range(get_step.seq, 'seq', 1, 2147483647);
    RETURN QUERY
    SELECT s.kind, s.stop_reason, s.usage, s.request_id, e.stop_sequence, e.stop_details, s.attempt, s.created_at
    FROM runrow.agent_step AS s
    LEFT JOIN runrow.agent_step_ending AS e ON e.run_id = s.run_id AND e.seq = s.seq
    WHERE s.run_id = get_step.run_id AND s.seq = get_step.seq;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run_id % has no step %', get_step.run_id, get_step.seq
            USING ERRCODE = 'no_data_found';
    END IF;
END
$fn$;

COMMENT ON FUNCTION runrow.get_step(uuid, integer) IS
'What the step log keeps beside a step''s payload: its kind, and for a model_turn the '
'stop_reason, usage, provider request_id, stop_sequence (which of the run''s stop_sequences '
'fired) and stop_details (a refusal''s details), plus the attempt that wrote it and when. A '
'resumed worker, or a fork, reads how the last model turn ended from here (the durable log, '
'copied by fork_run), not from the journal, which trim_journal deletes. stop_sequence and '
'stop_details (agent_step_ending) are NULL when the turn had neither, and on steps written '
'before migration 0108. Two primary-key lookups. An unknown (run_id, seq) raises P0002.';

REVOKE ALL ON FUNCTION runrow.get_step(uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.get_step(uuid, integer) TO runrow_worker, runrow_client, runrow_auditor;
