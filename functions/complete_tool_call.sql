CREATE OR REPLACE FUNCTION runrow.complete_tool_call(
    run_id uuid, claim_token uuid, idempotency_key text, result jsonb, is_error boolean DEFAULT false
)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    e runrow.tool_effect;
    reported_error boolean;
    step_payload json;
    new_seq integer;
BEGIN
    -- Each _require_* helper only raises, and a PERFORM is a statement: called only when the
    -- test before it fails, in the arguments' order, so the first bad one is still named.
    IF complete_tool_call.run_id IS NULL OR complete_tool_call.claim_token IS NULL
       OR complete_tool_call.idempotency_key IS NULL THEN
        PERFORM runrow._require_not_null(complete_tool_call.run_id, 'run_id');
        PERFORM runrow._require_not_null(complete_tool_call.claim_token, 'claim_token');
        PERFORM runrow._require_not_null(complete_tool_call.idempotency_key, 'idempotency_key');
    END IF;
    IF NOT runrow._is_tool_call_key(complete_tool_call.idempotency_key) THEN
        RAISE EXCEPTION 'idempotency_key must be 64 lowercase hex characters, as runrow.tool_call_key returns'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF complete_tool_call.result IS NULL THEN
        PERFORM runrow._require_not_null(complete_tool_call.result, 'result');
    END IF;
    IF octet_length(complete_tool_call.result::text) > 8388608 THEN
        RAISE EXCEPTION 'result is too large: the limit is 8 MiB' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF complete_tool_call.is_error IS NULL THEN
        PERFORM runrow._require_not_null(complete_tool_call.is_error, 'is_error');
    END IF;

    -- The fence (fenced out: nothing written, NULL returned).
    IF NOT runrow._hold_claim(complete_tool_call.run_id, complete_tool_call.claim_token) THEN
        RETURN NULL;
    END IF;

    SELECT t.* INTO e FROM runrow.tool_effect AS t
    WHERE t.idempotency_key = complete_tool_call.idempotency_key
    FOR UPDATE;
    IF NOT FOUND OR e.run_id <> complete_tool_call.run_id THEN
        RAISE EXCEPTION 'idempotency_key is not a tool call of this run: call begin_tool_call first'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF e.state = 'done' THEN
        -- A retried complete whose first commit the caller never heard about: same answer.
        IF e.result = complete_tool_call.result AND e.is_error = (complete_tool_call.is_error OR e.approved IS FALSE) THEN
            RETURN e.result_step_seq;
        END IF;
        RAISE EXCEPTION 'idempotency_key already has a different result recorded (step %); results never change',
            e.result_step_seq
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF e.state NOT IN ('executing', 'rejected') THEN
        RAISE EXCEPTION 'idempotency_key is %: only a call begin_tool_call said to execute (or that was rejected) '
            'takes a result', e.state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;

    -- A rejection always reaches the model as an error.
    reported_error := complete_tool_call.is_error OR e.state = 'rejected';
    -- The Messages API tool_result block. content is the result itself when it is a string or
    -- a non-empty array of content blocks (each an object whose type is one the API takes in a
    -- tool_result: the SDK's ToolResultBlockParam Content, with that type's required fields),
    -- otherwise the result's JSON text. Any other array ([{"id": 1}], ["a", "b"], [], a form's
    -- fields [{"type": "text", "name": "email"}]) is a tool's ordinary return value: sent as is,
    -- the API refused the next request (400 tool_result.content.0) after the tool had run.
    step_payload := format('{"type":"tool_result","tool_use_id":%s,"content":%s,"is_error":%s}',
        to_json(e.tool_use_id)::text,
        CASE WHEN jsonb_typeof(complete_tool_call.result) = 'string'
                  OR (jsonb_typeof(complete_tool_call.result) = 'array'
                      AND jsonb_array_length(complete_tool_call.result) > 0
                      AND NOT EXISTS (
                          SELECT 1 FROM jsonb_array_elements(complete_tool_call.result) AS b (block)
                          WHERE NOT coalesce(CASE b.block ->> 'type'
                              WHEN 'text' THEN jsonb_typeof(b.block -> 'text') = 'string'
                              WHEN 'image' THEN jsonb_typeof(b.block -> 'source') = 'object'
                              WHEN 'document' THEN jsonb_typeof(b.block -> 'source') = 'object'
                              WHEN 'search_result' THEN jsonb_typeof(b.block -> 'source') = 'string'
                                  AND jsonb_typeof(b.block -> 'title') = 'string'
                                  AND jsonb_typeof(b.block -> 'content') = 'array'
                              WHEN 'tool_reference' THEN jsonb_typeof(b.block -> 'tool_name') = 'string'
                              WHEN 'browser_state' THEN jsonb_typeof(b.block -> 'tabs') = 'array'
                          END, false)))
                  THEN complete_tool_call.result::text
             ELSE to_json(complete_tool_call.result::text)::text END,
        reported_error::text)::json;

    new_seq := runrow._append_step(e.run_id, 'tool_result', step_payload, NULL);
    UPDATE runrow.tool_effect AS t
    SET state = 'done', result = complete_tool_call.result, is_error = reported_error,
        result_step_seq = new_seq, completed_at = now()
    WHERE t.idempotency_key = e.idempotency_key;
    RETURN new_seq;
END
$fn$;

COMMENT ON FUNCTION runrow.complete_tool_call(uuid, uuid, text, jsonb, boolean) IS
'Record the result of a tool call begun with begin_tool_call and, in the same transaction, '
'append its tool_result step; returns that step''s seq. The step payload is the Messages API '
'block {"type":"tool_result","tool_use_id":<the tool_use id>,"content":<result if it is a '
'string or a non-empty array of content blocks (objects whose "type" is text with a string '
'text, image or document with an object source, search_result with a string source and title '
'and an array content, tool_reference with a string tool_name, or browser_state with an array '
'tabs), else its JSON text as a string: '
'any other array, an object, a number, a boolean, null>,"is_error":<bool>}; '
'consecutive tool_result steps form one user message in conversation_history. Only for a call '
'in state executing or rejected (a rejection is always recorded as is_error = true); 55000 '
'otherwise. The result is immutable: repeating the same call returns the same seq, a '
'different result is 55000. Fenced: NULL, nothing written, unless claim_token matches a '
'running run. NULLs raise 22004, a malformed or foreign key 22023. At most 8 MiB.';

REVOKE ALL ON FUNCTION runrow.complete_tool_call(uuid, uuid, text, jsonb, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.complete_tool_call(uuid, uuid, text, jsonb, boolean) TO runrow_worker;
