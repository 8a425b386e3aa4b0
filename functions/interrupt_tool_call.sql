CREATE OR REPLACE FUNCTION runrow.interrupt_tool_call(
    run_id uuid, claim_token uuid, idempotency_key text, reason text
)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    e runrow.tool_effect;
    new_state text;
    last_seq bigint;
BEGIN
    -- Each _require_* helper only raises, and a PERFORM is a statement: called only when the
    -- test before it fails, in the arguments' order, so the first bad one is still named.
    IF interrupt_tool_call.run_id IS NULL OR interrupt_tool_call.claim_token IS NULL
       OR interrupt_tool_call.idempotency_key IS NULL THEN
        PERFORM runrow._require_not_null(interrupt_tool_call.run_id, 'run_id');
        PERFORM runrow._require_not_null(interrupt_tool_call.claim_token, 'claim_token');
        PERFORM runrow._require_not_null(interrupt_tool_call.idempotency_key, 'idempotency_key');
    END IF;
    IF NOT runrow._is_tool_call_key(interrupt_tool_call.idempotency_key) THEN
        RAISE EXCEPTION 'idempotency_key must be 64 lowercase hex characters, as runrow.tool_call_key returns'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF interrupt_tool_call.reason IS NULL THEN
        PERFORM runrow._require_not_null(interrupt_tool_call.reason, 'reason');
    END IF;
    IF interrupt_tool_call.reason = '' OR length(interrupt_tool_call.reason) > 1000 THEN
        RAISE EXCEPTION 'reason must say why the call was cut short in 1 to 1000 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The fence; lock order everywhere: the run, then its effect.
    IF NOT runrow._hold_claim(interrupt_tool_call.run_id, interrupt_tool_call.claim_token) THEN
        RETURN NULL;
    END IF;
    SELECT t.* INTO e FROM runrow.tool_effect AS t
    WHERE t.idempotency_key = interrupt_tool_call.idempotency_key
    FOR UPDATE;
    IF NOT FOUND OR e.run_id <> interrupt_tool_call.run_id THEN
        RAISE EXCEPTION 'idempotency_key is not a tool call of this run: call begin_tool_call first'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- done: the result landed first, so nothing was cut short. uncertain: this call's
    -- earlier commit went unheard; the same answer, nothing written twice.
    IF e.state IN ('done', 'uncertain') THEN
        RETURN e.state;
    END IF;
    IF e.state <> 'executing' THEN
        RAISE EXCEPTION 'idempotency_key is %: only a call begin_tool_call said to execute (or approved) can be '
            'interrupted', e.state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;

    -- Half an email may have gone out; only a person may decide to send it again.
    -- A pure or idempotent call stays executing: running it again is safe.
    new_state := CASE WHEN e.effect IN ('non_idempotent', 'irreversible') THEN 'uncertain' ELSE 'executing' END;
    IF new_state = 'uncertain' THEN
        UPDATE runrow.tool_effect AS t SET state = 'uncertain'
        WHERE t.idempotency_key = e.idempotency_key;
    END IF;
    last_seq := runrow._journal(e.run_id, jsonb_build_array(jsonb_build_object(
        'type', 'tool_interrupted',
        'idempotency_key', e.idempotency_key,
        'tool', e.tool,
        'tool_use_id', e.tool_use_id,
        'effect', e.effect,
        'state', new_state,
        'reason', interrupt_tool_call.reason)));
    PERFORM runrow._wake_tails(e.run_id, last_seq);
    RETURN new_state;
END
$fn$;

COMMENT ON FUNCTION runrow.interrupt_tool_call(uuid, uuid, text, text) IS
'A worker cut a tool call short (the run was stopped, the worker drained) after '
'begin_tool_call said execute or approved and before any result: record that, with why '
'(reason, 1 to 1000 characters), and journal tool_interrupted {idempotency_key, tool, '
'tool_use_id, effect, state, reason}. Returns the call''s state: uncertain for a '
'non_idempotent or irreversible call (it may have happened half-way; the next begin_tool_call '
'of any attempt parks the run for a person, who decides with resolve_approval, and it is never '
'run again without one), executing for a pure or idempotent call (nothing changes: a later '
'attempt runs it again, or the worker records a cancelled result with complete_tool_call). '
'A call already done or already uncertain returns that state and writes nothing; a call in '
'another state raises 55000. Fenced: NULL, nothing written, unless claim_token matches a '
'running run. NULLs raise 22004; a malformed key, a key of another run or a bad reason 22023.';

REVOKE ALL ON FUNCTION runrow.interrupt_tool_call(uuid, uuid, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.interrupt_tool_call(uuid, uuid, text, text) TO runrow_worker;
