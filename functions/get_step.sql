CREATE OR REPLACE FUNCTION runrow.get_step(run_id uuid, seq integer)
RETURNS TABLE (
    kind text,
    stop_reason text,
    usage jsonb,
    request_id text,
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
    SELECT s.kind, s.stop_reason, s.usage, s.request_id, s.attempt, s.created_at
    FROM runrow.agent_step AS s
    WHERE s.run_id = get_step.run_id AND s.seq = get_step.seq;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run_id % has no step %', get_step.run_id, get_step.seq
            USING ERRCODE = 'no_data_found';
    END IF;
END
$fn$;

COMMENT ON FUNCTION runrow.get_step(uuid, integer) IS
'What the step log keeps beside a step''s payload: its kind, and for a model_turn the '
'stop_reason, usage and provider request_id, plus the attempt that wrote it and when. A '
'resumed worker reads how the last model turn ended from here (the durable log), not from '
'the journal. One primary-key lookup. An unknown (run_id, seq) raises P0002.';

REVOKE ALL ON FUNCTION runrow.get_step(uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.get_step(uuid, integer) TO runrow_worker, runrow_client, runrow_auditor;
