CREATE OR REPLACE FUNCTION runrow.run_usage(run_id uuid)
RETURNS TABLE (
    model_turns bigint,
    input_tokens bigint,
    output_tokens bigint,
    cache_read_input_tokens bigint,
    cache_creation_input_tokens bigint
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    given integer;
BEGIN
    PERFORM runrow._require_not_null(run_usage.run_id, 'run_id');
    SELECT coalesce(a.forked_at_seq, 0) INTO given FROM runrow.agent_run AS a WHERE a.id = run_usage.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run_id % does not exist', run_usage.run_id USING ERRCODE = 'no_data_found';
    END IF;
    -- usage is the provider's object as received: a field that is missing or not a number
    -- (an older SDK, another provider) counts as 0 rather than failing the whole sum.
    RETURN QUERY
    SELECT
        count(*),
        coalesce(sum(CASE WHEN jsonb_typeof(s.usage -> 'input_tokens') = 'number'
            THEN (s.usage ->> 'input_tokens')::numeric END), 0)::bigint,
        coalesce(sum(CASE WHEN jsonb_typeof(s.usage -> 'output_tokens') = 'number'
            THEN (s.usage ->> 'output_tokens')::numeric END), 0)::bigint,
        coalesce(sum(CASE WHEN jsonb_typeof(s.usage -> 'cache_read_input_tokens') = 'number'
            THEN (s.usage ->> 'cache_read_input_tokens')::numeric END), 0)::bigint,
        coalesce(sum(CASE WHEN jsonb_typeof(s.usage -> 'cache_creation_input_tokens') = 'number'
            THEN (s.usage ->> 'cache_creation_input_tokens')::numeric END), 0)::bigint
    FROM runrow.agent_step AS s
    -- Not the steps a fork was given (1..forked_at_seq, copied from its source, which paid for
    -- them): a fork that never ran reported its source's tokens (the history audit).
    WHERE s.run_id = run_usage.run_id AND s.kind = 'model_turn' AND s.seq > given;
END
$fn$;

COMMENT ON FUNCTION runrow.run_usage(uuid) IS
'Per-run token totals from the step log (runrow status RUN): model_turns, and the sums over '
'its model_turn steps of usage.input_tokens (billed at the full input price), output_tokens, '
'cache_read_input_tokens and cache_creation_input_tokens, as the provider reported them; a '
'missing or non-numeric field counts 0. Every attempt''s committed turns count; a '
'fenced-out append_step stored nothing, so it adds nothing, and responses paid for with '
'record_usage (not stored as steps) are in the run''s spent_tokens, not here; the steps a fork '
'was given (1..forked_at_seq, paid for by its source) do not count. One index range '
'scan of the run''s steps. An unknown run_id raises P0002, a NULL one 22004.';

REVOKE ALL ON FUNCTION runrow.run_usage(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.run_usage(uuid) TO runrow_client, runrow_worker, runrow_auditor;
