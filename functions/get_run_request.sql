CREATE OR REPLACE FUNCTION runrow.get_run_request(run_id uuid)
RETURNS TABLE (
    conversation_id uuid,
    status text,
    model text,
    prompt_id text,
    system_prompt text,
    tools jsonb,
    metadata jsonb,
    forked_from uuid,
    forked_at_seq integer
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    PERFORM runrow._require_not_null(get_run_request.run_id, 'run_id');
    RETURN QUERY
    SELECT a.conversation_id, a.status, a.model, a.prompt_id, p.system_prompt, p.tools, a.metadata,
           a.forked_from, a.forked_at_seq
    FROM runrow.agent_run AS a
    JOIN runrow.prompt AS p ON p.id = a.prompt_id
    WHERE a.id = get_run_request.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run_id % does not exist', get_run_request.run_id USING ERRCODE = 'no_data_found';
    END IF;
END
$fn$;

COMMENT ON FUNCTION runrow.get_run_request(uuid) IS
'What a run''s model requests are made of, pinned at enqueue: model, the prompt (id, system_prompt, '
'tools) and metadata (the request parameters), with its conversation, status and fork origin. '
'With conversation_history it is everything needed to re-ask a run''s model turns (runrow replay) '
'in any language, at any time after the run, claim or no claim. Reads only. 22004 for a NULL '
'run_id, P0002 for an unknown one.';

REVOKE ALL ON FUNCTION runrow.get_run_request(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.get_run_request(uuid) TO runrow_worker, runrow_client;
