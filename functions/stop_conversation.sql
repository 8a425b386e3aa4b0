CREATE OR REPLACE FUNCTION runrow.stop_conversation(conversation_id uuid)
RETURNS TABLE (run_id uuid, action text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    target uuid;
BEGIN
    PERFORM runrow._require_not_null(stop_conversation.conversation_id, 'conversation_id');
    PERFORM runrow._lock_conversation(stop_conversation.conversation_id);

    -- One locking sweep over every active run of the conversation, queued, running and
    -- waiting together, in one transaction: a running turn that finishes meanwhile
    -- waits on our lock, and its wake then finds nothing left queued to start.
    FOR target IN
        SELECT a.id FROM runrow.agent_run AS a
        WHERE a.conversation_id = stop_conversation.conversation_id
          AND a.status IN ('queued', 'running', 'waiting')
        ORDER BY a.enqueue_seq
        FOR UPDATE
    LOOP
        action := runrow._stop_run(target);
        run_id := target;
        IF action NOT LIKE 'already\_%' THEN
            RETURN NEXT;
        END IF;
    END LOOP;
END
$fn$;

COMMENT ON FUNCTION runrow.stop_conversation(uuid) IS
'Stop a conversation in one transaction and one FOR UPDATE sweep: queued and waiting runs '
'are cancelled outright (complete journaled, user message handed back as a draft); a running '
'run gets cancel_requested, a cancel_requested journal event and a NOTIFY on runrow_cancel '
'(payload: run id), and its worker finalizes it cancelled keeping the partial text. No turn '
'of the conversation starts after the stop commits. Returns one row per run acted on, '
'action cancelled or cancel_requested; no rows when nothing was active.';

REVOKE ALL ON FUNCTION runrow.stop_conversation(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.stop_conversation(uuid) TO runrow_client;
