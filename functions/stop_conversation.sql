CREATE OR REPLACE FUNCTION runrow.stop_conversation(conversation_id uuid)
RETURNS TABLE (run_id uuid, action text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
-- A holder frozen inside its transaction (a paused worker mid-flush, a host cut off) keeps
-- a run's row locked until PostgreSQL ends its session; a stop waits at most this long for
-- every lock together (runrow._lock_run_by), then fails as a whole with 55P03
-- (runrow._stop_timed_out) and the caller retries.
SET lock_timeout = '5s'
AS $fn$
DECLARE
    deadline timestamptz := clock_timestamp() + current_setting('lock_timeout')::interval;
    target uuid;
    waiting_on uuid;
    found_any boolean := false;
BEGIN
    PERFORM runrow._require_not_null(stop_conversation.conversation_id, 'conversation_id');
    BEGIN
        PERFORM runrow._lock_conversation(stop_conversation.conversation_id);

        -- Every active run of the conversation, queued, running and waiting together, locked
        -- in turn order in one transaction: a running turn that finishes meanwhile waits on
        -- our lock, and its wake then finds nothing left queued to start. The set is stable:
        -- enqueue and retry hold the conversation lock we hold, so no run joins it.
        FOR target IN
            -- The open turns: the active one and the queued ones, each through its index.
            SELECT o.id FROM (
                SELECT a.id, a.enqueue_seq FROM runrow.agent_run AS a
                WHERE a.conversation_id = stop_conversation.conversation_id
                  AND a.status IN ('running', 'waiting')
                UNION ALL
                SELECT a.id, a.enqueue_seq FROM runrow.agent_run AS a
                WHERE a.conversation_id = stop_conversation.conversation_id
                  AND a.status = 'queued'
            ) AS o
            ORDER BY o.enqueue_seq
        LOOP
            found_any := true;
            waiting_on := target;  -- named in the error if this lock is not granted in time
            PERFORM runrow._lock_run_by(target, deadline);
            waiting_on := NULL;
            action := runrow._stop_run(target);
            run_id := target;
            IF action NOT LIKE 'already\_%' THEN
                RETURN NEXT;
            END IF;
        END LOOP;
        -- Nothing active: an idle conversation returns no rows, but an id that names none is an
        -- error, as cancel_run's is. Looked for only here, so a stop that acts pays nothing.
        -- A stop of a typo, or of a run's id, used to succeed having stopped nothing.
        IF NOT found_any AND NOT EXISTS (
            SELECT 1 FROM runrow.conversation AS c WHERE c.id = stop_conversation.conversation_id
        ) THEN
            IF EXISTS (SELECT 1 FROM runrow.agent_run AS a WHERE a.id = stop_conversation.conversation_id) THEN
                RAISE EXCEPTION 'conversation_id % does not exist', stop_conversation.conversation_id
                    USING ERRCODE = 'no_data_found',
                          HINT = 'It is a run''s id: cancel_run stops one run.';
            END IF;
            RAISE EXCEPTION 'conversation_id % does not exist', stop_conversation.conversation_id
                USING ERRCODE = 'no_data_found';
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        PERFORM runrow._stop_timed_out(stop_conversation.conversation_id, waiting_on);
    END;
END
$fn$;

COMMENT ON FUNCTION runrow.stop_conversation(uuid) IS
'Stop a conversation in one transaction, locking every active run in turn order: queued and '
'waiting runs are cancelled outright (complete journaled, user message handed back as a '
'draft); a running run gets cancel_requested, a cancel_requested journal event and a NOTIFY '
'on runrow_cancel (payload: run id), and its worker finalizes it cancelled keeping the '
'partial text. No turn of the conversation starts after the stop commits. Returns one row '
'per run acted on, action cancelled or cancel_requested; no rows when nothing was active. An '
'unknown conversation_id raises P0002 (with a hint when it is a run''s id: cancel_run). '
'All or nothing: the locks not all granted within the function''s lock_timeout (5 s in all '
'on the database clock, other stops waiting ahead included; a holder frozen inside its '
'transaction) raises 55P03 naming the run, and nothing is stopped.';

REVOKE ALL ON FUNCTION runrow.stop_conversation(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.stop_conversation(uuid) TO runrow_client;
