-- Stop one run the caller has already locked FOR UPDATE. Shared by stop_conversation
-- and cancel_run. Returns the action taken.
CREATE OR REPLACE FUNCTION runrow._stop_run(run_id uuid)
RETURNS text
LANGUAGE plpgsql
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
            error = 'stopped before it finished', updated_at = now()
        WHERE a.id = r.id;
        UPDATE runrow.message AS m SET status = 'draft' WHERE m.id = r.user_message_id;
        PERFORM runrow._journal_complete(r.id, r.conversation_id, 'cancelled', NULL, 'stopped before it finished');
        RETURN 'cancelled';
    ELSIF r.status = 'running' THEN
        -- Cooperative: the flag is the truth, the NOTIFY the fast path; the worker
        -- finalizes cancelled and keeps the partial text already journaled.
        IF NOT r.cancel_requested THEN
            UPDATE runrow.agent_run AS a SET cancel_requested = true, updated_at = now() WHERE a.id = r.id;
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

-- The error of a stop that hit its lock_timeout (stop_conversation, cancel_run; and so
-- enqueue_run's interrupt). The stop is all or nothing: no queued turn is cancelled while
-- the running one could not be flagged, because that run, reaped and requeued, would start
-- again after a stop that had reported success. run_id: the run whose row lock the stop
-- waited for; NULL when it waited for the conversation (another stop or enqueue of it).
CREATE OR REPLACE FUNCTION runrow._stop_timed_out(conversation_id uuid, run_id uuid)
RETURNS void
LANGUAGE plpgsql
AS $fn$
BEGIN
    IF _stop_timed_out.run_id IS NOT NULL THEN
        RAISE EXCEPTION 'run % is locked by an unresponsive session (no answer within %): nothing was stopped',
            _stop_timed_out.run_id, current_setting('lock_timeout')
            USING ERRCODE = 'lock_not_available',
                  DETAIL = 'A worker frozen or cut off inside a transaction keeps its run''s row locked.',
                  HINT = 'PostgreSQL ends that session within its idle_in_transaction_session_timeout '
                      || '(about one lease for runrow workers), then the reaper takes the run; '
                      || 'retry the stop in a few seconds.';
    END IF;
    RAISE EXCEPTION 'conversation % is being changed by another session that did not finish within %: nothing was stopped',
        _stop_timed_out.conversation_id, current_setting('lock_timeout')
        USING ERRCODE = 'lock_not_available',
              DETAIL = 'Another stop or enqueue of this conversation is itself waiting on a run held by an unresponsive session.',
              HINT = 'PostgreSQL ends that session within its idle_in_transaction_session_timeout '
                  || '(about one lease for runrow workers), then the reaper takes the run; '
                  || 'retry the stop in a few seconds.';
END
$fn$;

REVOKE ALL ON FUNCTION runrow._stop_timed_out(uuid, uuid) FROM PUBLIC;

-- Lock a run's row FOR UPDATE before `deadline` on the database clock (stop_conversation,
-- cancel_run); false when no such run, 55P03 when the deadline passed. One row lock can be two
-- waits, each timed by lock_timeout on its own: the tuple's queue of lockers (another stop of
-- the run waiting ahead), then the holder's transaction. So a cancel behind another cancel of a
-- run a frozen session held waited 5 s in each, and answered after 10 s, not the 5 s promised
-- (the audit). Each try gets half of what is left, so both waits together end by the deadline,
-- and tries follow one another until it.
CREATE OR REPLACE FUNCTION runrow._lock_run_by(run_id uuid, deadline timestamptz)
RETURNS boolean
LANGUAGE plpgsql
AS $fn$
DECLARE
    left_ms bigint;
BEGIN
    LOOP
        left_ms := floor(extract(EPOCH FROM _lock_run_by.deadline - clock_timestamp()) * 1000);
        IF left_ms < 2 THEN
            RAISE EXCEPTION 'run % not locked by its deadline', _lock_run_by.run_id
                USING ERRCODE = 'lock_not_available';
        END IF;
        -- Local to the caller's transaction, and undone with it (or its block) on an error.
        PERFORM set_config('lock_timeout', (left_ms / 2)::text || 'ms', true);
        BEGIN
            PERFORM 1 FROM runrow.agent_run AS a WHERE a.id = _lock_run_by.run_id FOR UPDATE;
            RETURN found;
        EXCEPTION WHEN lock_not_available THEN
            NULL;  -- the next try, with what is left
        END;
    END LOOP;
END
$fn$;

COMMENT ON FUNCTION runrow._lock_run_by(uuid, timestamptz) IS
'Lock run_id''s row FOR UPDATE before deadline (database clock), for the stops (cancel_run, '
'stop_conversation): true when locked, false when no such run, 55P03 when the deadline passed '
'first. Tries with lock_timeout set to half of what is left, local to the caller''s '
'transaction, so the two waits one row lock can make (the queue of lockers, the holder) end by '
'the deadline together.';

REVOKE ALL ON FUNCTION runrow._lock_run_by(uuid, timestamptz) FROM PUBLIC;
