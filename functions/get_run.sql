CREATE OR REPLACE FUNCTION runrow.get_run(run_id uuid)
RETURNS TABLE (
    id uuid,
    conversation_id uuid,
    user_id text,
    status text,
    attempt integer,
    max_attempts integer,
    model text,
    cancel_requested boolean,
    retry_of uuid,
    result jsonb,
    error text,
    created_at timestamptz,
    started_at timestamptz,
    finished_at timestamptz
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    PERFORM runrow._require_not_null(get_run.run_id, 'run_id');
    RETURN QUERY
    SELECT a.id, a.conversation_id, a.user_id, a.status, a.attempt, a.max_attempts, a.model,
           a.cancel_requested, a.retry_of, a.result, a.error, a.created_at, a.started_at, a.finished_at
    FROM runrow.agent_run AS a
    WHERE a.id = get_run.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run_id % does not exist', get_run.run_id USING ERRCODE = 'no_data_found';
    END IF;
END
$fn$;

COMMENT ON FUNCTION runrow.get_run(uuid) IS
'The public state of one run for clients (GET /runs/{id}, runrow tail): status, attempts, '
'model, cancel flag, retry link, result or error and timestamps; never the claim token. '
'An unknown run_id raises P0002.';

REVOKE ALL ON FUNCTION runrow.get_run(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.get_run(uuid) TO runrow_client, runrow_worker, runrow_auditor;
