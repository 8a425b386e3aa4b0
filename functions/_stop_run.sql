-- Stop one run the caller has already locked FOR UPDATE. Shared by stop_conversation
-- and cancel_run. Returns the action taken.
CREATE OR REPLACE FUNCTION runrow._stop_run(run_id uuid)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    r runrow.agent_run;
    last_seq bigint;
BEGIN
    SELECT a.* INTO STRICT r FROM runrow.agent_run AS a WHERE a.id = _stop_run.run_id;

    IF r.status IN ('queued', 'waiting') THEN
        -- No worker holds it: cancel outright and hand the user message back as a draft.
        UPDATE runrow.agent_run AS a
        SET status = 'cancelled', finished_at = now(), cancel_requested = true,
            error = 'stopped before it finished'
        WHERE a.id = r.id;
        UPDATE runrow.message AS m SET status = 'draft' WHERE m.id = r.user_message_id;
        PERFORM runrow._journal_complete(r.id, r.conversation_id, 'cancelled', NULL, 'stopped before it finished');
        RETURN 'cancelled';
    ELSIF r.status = 'running' THEN
        -- Cooperative: the flag is the truth, the NOTIFY the fast path; the worker
        -- finalizes cancelled and keeps the partial text already journaled.
        IF NOT r.cancel_requested THEN
            UPDATE runrow.agent_run AS a SET cancel_requested = true WHERE a.id = r.id;
            last_seq := runrow._journal(r.id, '[{"type": "cancel_requested"}]'::jsonb);
            PERFORM runrow._wake_tails(r.id, last_seq);
        END IF;
        PERFORM pg_notify('runrow_cancel', r.id::text);
        RETURN 'cancel_requested';
    END IF;
    RETURN 'already_' || r.status;
END
$fn$;

REVOKE ALL ON FUNCTION runrow._stop_run(uuid) FROM PUBLIC;
