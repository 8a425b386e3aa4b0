CREATE OR REPLACE FUNCTION runrow.resolve_approval(
    idempotency_key text, approved boolean, decided_by text, note text DEFAULT NULL
)
RETURNS uuid
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    owner_run uuid;
    r runrow.agent_run;
    e runrow.tool_effect;
    last_seq bigint;
BEGIN
    PERFORM runrow._require_not_null(resolve_approval.idempotency_key, 'idempotency_key');
    PERFORM runrow._require_not_null(resolve_approval.approved, 'approved');
    PERFORM runrow._require_not_null(resolve_approval.decided_by, 'decided_by');
    -- Who decided is the record a person is held to: white space names nobody.
    IF btrim(resolve_approval.decided_by, runrow._white_space()) = '' OR length(resolve_approval.decided_by) > 200 THEN
        RAISE EXCEPTION 'decided_by must name the person deciding in 1 to 200 characters, not only white space'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The name the decision is recorded under, as operators read it: no control character.
    PERFORM runrow._require_printable(resolve_approval.decided_by, 'decided_by');
    IF resolve_approval.note = '' THEN
        RAISE EXCEPTION 'note must be NULL (no note) or text, not empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF length(resolve_approval.note) > 10000 THEN
        RAISE EXCEPTION 'note is too long: at most 10000 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;

    SELECT t.run_id INTO owner_run FROM runrow.tool_effect AS t
    WHERE t.idempotency_key = resolve_approval.idempotency_key;
    IF NOT FOUND THEN
        -- Every key is 64 hex digits (begin_tool_call): one with a control character names no
        -- call, and quoted below it would reach the log through the error.
        PERFORM runrow._require_printable(resolve_approval.idempotency_key, 'idempotency_key');
        RAISE EXCEPTION 'idempotency_key % does not exist', left(resolve_approval.idempotency_key, 80)
            USING ERRCODE = 'no_data_found';
    END IF;
    -- Lock order everywhere: the run, then its effect.
    SELECT a.* INTO STRICT r FROM runrow.agent_run AS a WHERE a.id = owner_run FOR UPDATE;
    SELECT t.* INTO STRICT e FROM runrow.tool_effect AS t
    WHERE t.idempotency_key = resolve_approval.idempotency_key
    FOR UPDATE;

    -- Deciding twice, or deciding a call nobody waits on, is an error rather than a
    -- silent no-op: the second person learns that someone else already decided.
    IF e.state NOT IN ('needs_approval', 'uncertain') THEN
        RAISE EXCEPTION '%', format('idempotency_key %s is not waiting for a decision: it is %s%s',
            resolve_approval.idempotency_key, e.state,
            CASE WHEN e.decided_by IS NOT NULL
                 THEN format(' (decided by %s at %s)', e.decided_by, e.decided_at) ELSE '' END)
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF r.status <> 'waiting' THEN
        RAISE EXCEPTION 'idempotency_key %: its run % is %, not waiting for a decision',
            resolve_approval.idempotency_key, r.id, r.status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;

    UPDATE runrow.tool_effect AS t
    SET state = CASE WHEN resolve_approval.approved THEN 'approved' ELSE 'rejected' END,
        approved = resolve_approval.approved,
        decided_by = resolve_approval.decided_by,
        decision_note = resolve_approval.note,
        decided_at = now()
    WHERE t.idempotency_key = e.idempotency_key;

    UPDATE runrow.agent_run AS a SET status = 'queued', updated_at = now() WHERE a.id = r.id;

    last_seq := runrow._journal(r.id, jsonb_build_array(
        jsonb_build_object(
            'type', 'approval_resolved', 'idempotency_key', e.idempotency_key, 'reason', e.state,
            'tool', e.tool, 'approved', resolve_approval.approved, 'decided_by', resolve_approval.decided_by,
            'note', resolve_approval.note),
        jsonb_build_object(
            'type', 'run_requeued', 'attempt', r.attempt, 'max_attempts', r.max_attempts,
            'reason', 'approval_resolved')));
    PERFORM runrow._wake_tails(r.id, last_seq);
    PERFORM runrow._wake_dispatchers(r.conversation_id);
    RETURN r.id;
END
$fn$;

COMMENT ON FUNCTION runrow.resolve_approval(text, boolean, text, text) IS
'A person''s decision on a tool call listed in runrow.pending_approvals. needs_approval (an '
'irreversible call not yet run): approved = true lets it run, false rejects it. uncertain (an '
'irreversible call that began and has no result, or a non_idempotent or irreversible call a '
'worker cut short, so it may have happened): approved = true '
'means "it did not happen, run it", false means "do not run it" (the model is told the call '
'was rejected; say what you know in note, which reaches the worker). Records approved, '
'decided_by, note and the time; requeues the waiting run (journals approval_resolved and '
'run_requeued, NOTIFYs runrow_enqueued) and returns its id. A key that is not waiting for a '
'decision (already decided, or its run no longer waiting, e.g. stopped) raises 55000: a '
'second decision never overrides the first. Unknown key P0002; NULLs 22004; an empty or '
'over-long decided_by or note 22023.';

REVOKE ALL ON FUNCTION runrow.resolve_approval(text, boolean, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.resolve_approval(text, boolean, text, text) TO runrow_client;
