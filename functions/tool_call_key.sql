CREATE OR REPLACE FUNCTION runrow.tool_call_key(
    run_id uuid, step_seq integer, tool_use_id text, tool text, args jsonb
)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    -- Each _require_* helper only raises, and a PERFORM is a statement (begin_tool_call calls
    -- this once per tool_use block it looks at): called only when the test before it fails,
    -- in the arguments' order, so the first bad one is still named.
    IF tool_call_key.run_id IS NULL OR tool_call_key.step_seq IS NULL OR tool_call_key.step_seq < 1
       OR tool_call_key.tool_use_id IS NULL THEN
        PERFORM runrow._require_not_null(tool_call_key.run_id, 'run_id');
        PERFORM runrow._require_range(tool_call_key.step_seq, 'step_seq', 1, 2147483647);
        PERFORM runrow._require_not_null(tool_call_key.tool_use_id, 'tool_use_id');
    END IF;
    IF tool_call_key.tool_use_id = '' THEN
        RAISE EXCEPTION 'tool_use_id must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF tool_call_key.tool IS NULL THEN
        PERFORM runrow._require_not_null(tool_call_key.tool, 'tool');
    END IF;
    IF tool_call_key.tool = '' THEN
        RAISE EXCEPTION 'tool must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF tool_call_key.args IS NULL THEN
        PERFORM runrow._require_not_null(tool_call_key.args, 'args');
    END IF;
    IF jsonb_typeof(tool_call_key.args) <> 'object' THEN
        RAISE EXCEPTION 'args must be a JSON object (a tool_use block''s input), got %', jsonb_typeof(tool_call_key.args)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN encode(sha256(convert_to(
        tool_call_key.run_id::text || ':' || tool_call_key.step_seq::text || ':' || tool_call_key.tool_use_id
        || ':' || tool_call_key.tool || ':' || runrow._canonical_json(tool_call_key.args),
        'UTF8')), 'hex');
END
$fn$;

COMMENT ON FUNCTION runrow.tool_call_key(uuid, integer, text, text, jsonb) IS
'The idempotency key of a tool call, derived from its position so every attempt computes the '
'same one: lowercase hex SHA-256 of the UTF-8 bytes of '
'run_id || '':'' || step_seq || '':'' || tool_use_id || '':'' || tool || '':'' || canonical(args), where '
'run_id is the lowercase hyphenated uuid, step_seq the decimal seq of the model_turn step '
'holding the tool_use block, tool_use_id that block''s id, tool its name, and canonical(args) '
'the block''s input as JSON with object keys sorted by code point, no whitespace, strings '
'escaped as JSON requires (", \\, \b \f \n \r \t, other controls as \u00xx lowercase; '
'non-ASCII kept as is) and numbers in plain decimal as PostgreSQL numeric prints them (1e2 -> '
'100, 1.50 -> 1.50, 1e-7 -> 0.0000001, -0 -> 0). pyworker/keys.py is the Python twin. args '
'must be an object; NULLs raise 22004, empty strings and non-objects 22023.';

REVOKE ALL ON FUNCTION runrow.tool_call_key(uuid, integer, text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.tool_call_key(uuid, integer, text, text, jsonb) TO runrow_worker, runrow_client;
