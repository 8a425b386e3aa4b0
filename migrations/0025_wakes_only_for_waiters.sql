-- depends: 0024_journal_delete_guard_per_statement
-- Notifications only where somebody waits (issue 11). PostgreSQL 15 signals every LISTENing
-- backend of the database on every notifying commit, whatever the channel, and notifying
-- commits serialize on the global notify lock; so a wake that nobody waits for costs every
-- listener of the fleet a transaction, and every writer its place in that queue.
--
-- 1. runrow_enqueued on an ending is sent only when the ending lets something start: a
--    queued turn of the same conversation (it was waiting on this one), a run of a
--    concurrency key that has a limit (a slot came free), or a webhook delivery (the delivery
--    loop waits on the same channel). The triggers that already see each case send it, so
--    every ending path (finish, reap to dead, stop, budget) is covered by one rule.
-- 2. A run's journal channel is notified only while a tail has registered a watch on it
--    (runrow.watch_runs, a row here that expires unless refreshed). A run nobody follows
--    ends without a notification at all.

CREATE TABLE runrow.run_watch (
    run_id uuid PRIMARY KEY,
    expires_at timestamptz NOT NULL,
    -- Registered under the run's row lock, so no write in flight then can have missed it.
    confirmed boolean NOT NULL
);

COMMENT ON TABLE runrow.run_watch IS
'Runs a tail follows: while a row is here and unexpired, every journal write of the run '
'notifies its channel (runrow.events_channel). Written by runrow.watch_runs (register or '
'refresh), deleted by the run''s ending and, once expired, by later watch_runs calls. confirmed: '
'registered under the run''s row lock (see watch_runs). No foreign key: runs are never '
'deleted, and watch_runs checks that the run exists.';

-- watch_runs' bounded prune of watches whose tail went away without the run ending.
CREATE INDEX run_watch_expires ON runrow.run_watch (expires_at);

REVOKE ALL ON runrow.run_watch FROM PUBLIC;
GRANT SELECT ON runrow.run_watch TO runrow_auditor;

CREATE OR REPLACE FUNCTION runrow._unblock_next_turn() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    nxt record;
    marked boolean;
BEGIN
    -- A run of a capped concurrency key ended: one of the key's queued runs may start now,
    -- in any conversation, and a dispatcher may be idle waiting for exactly that.
    IF NEW.concurrency_key IS NOT NULL AND OLD.status IN ('running', 'waiting') AND EXISTS (
        SELECT 1 FROM runrow.concurrency_limit AS l WHERE l.concurrency_key = NEW.concurrency_key
    ) THEN
        PERFORM pg_notify('runrow_enqueued', NEW.conversation_id::text);
    END IF;
    -- The conversation's oldest open turn after this one ended. Only a turn younger than the
    -- ended one can have been waiting on it (an older open turn was ahead of it all along), so
    -- locks are taken in turn order, the order stop_conversation takes them in.
    SELECT n.id, n.enqueue_seq, n.status INTO nxt
    FROM runrow.agent_run AS n
    WHERE n.conversation_id = NEW.conversation_id
      AND n.status IN ('queued', 'running', 'waiting')
    ORDER BY n.enqueue_seq
    LIMIT 1;
    IF NOT FOUND OR nxt.status <> 'queued' OR nxt.enqueue_seq < NEW.enqueue_seq THEN
        RETURN NULL;
    END IF;
    -- Locked even when unmarked: a claim that read this turn as blocked before we ended the
    -- previous one must not mark it after we looked (it locks FOR UPDATE SKIP LOCKED).
    SELECT n.claim_blocked INTO marked FROM runrow.agent_run AS n
    WHERE n.id = nxt.id AND n.status = 'queued'
    FOR KEY SHARE;
    IF marked THEN
        UPDATE runrow.agent_run AS n SET claim_blocked = false WHERE n.id = nxt.id;
    END IF;
    -- The turn that waited on this one may start now (sent once per conversation and
    -- transaction: PostgreSQL folds identical notifications of one transaction).
    PERFORM pg_notify('runrow_enqueued', NEW.conversation_id::text);
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION runrow._webhook_outbox() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    delivery uuid := gen_random_uuid();
BEGIN
    INSERT INTO runrow.webhook_delivery (id, run_id, url, payload)
    VALUES (delivery, NEW.id, NEW.webhook_url, jsonb_build_object(
        'id', delivery,
        'type', 'run.ended',
        'run_id', NEW.id,
        'conversation_id', NEW.conversation_id,
        'user_id', NEW.user_id,
        'status', NEW.status,
        'attempt', NEW.attempt,
        'result', NEW.result,
        'error', NEW.error,
        'metadata', NEW.metadata,
        'finished_at', NEW.finished_at))
    -- Unreachable while terminal states are sticky; kept so that a second ending could never
    -- raise inside someone's terminal write.
    ON CONFLICT (run_id) DO NOTHING;
    -- The delivery loop idles on runrow_enqueued: a new delivery goes out at once.
    PERFORM pg_notify('runrow_enqueued', NEW.conversation_id::text);
    RETURN NULL;
END
$fn$;
