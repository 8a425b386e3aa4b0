-- depends: 0029_agent_run_hot_columns_last
-- agent_run without BEFORE UPDATE row triggers (issue 11: WAL and CPU per lifecycle).
--
-- Why: when a table has any BEFORE UPDATE row trigger, PostgreSQL locks each row before it
-- updates it, to hand the trigger the version it will replace (GetTupleForTrigger), and it does
-- so before it looks at the trigger's WHEN clause. That lock is a WAL record of its own (54
-- bytes) and a trip through heap_lock_tuple for every finish, heartbeat, release and reap,
-- although agent_run_guard's WHEN skips the call for every legal move. The claim's rows were
-- already locked by its FOR UPDATE SKIP LOCKED, so only the claim was spared.
--
-- Now:
-- - agent_run_guard is an AFTER UPDATE row trigger with the same rules (terminal states sticky
--   but for trim_journal dropping the snapshot, identity immutable, status only along the
--   lifecycle) and the same WHEN: an AFTER row trigger's WHEN is tested with the old and new
--   rows the executor already has, and a false one queues nothing. A violation still fails
--   the statement (23000) before it can commit.
-- - It no longer stamps updated_at (an AFTER trigger cannot change the row): every runrow
--   function that updates agent_run sets updated_at = now() itself, as the claim, the
--   finishes and the heartbeat already did, so updated_at means what it meant. A hand-written
--   UPDATE by the owner is no longer stamped.
-- - The concurrency cap (agent_run_concurrency_limit, a BEFORE row trigger since 0018) moves
--   into agent_run_after_update, which already runs once per UPDATE statement: for each capped
--   key a statement starts runs of (in key order), the limit row is locked (UPDATE, as before,
--   so concurrent starts of one key serialize on it) and the key's running and waiting runs
--   counted with a fresh snapshot, this statement's included; over the limit, the statement
--   fails with check_violation naming the constraint agent_run_concurrency_limit, as before.
--
-- Measured (tests/test_agent_run_layout.py counts the WAL records): see the commit message.

CREATE OR REPLACE FUNCTION runrow._agent_run_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
BEGIN
    -- Invariant 2: terminal states are sticky. Nothing, not even the table owner,
    -- moves a row out of completed/failed/cancelled/dead or edits it. The one change
    -- allowed is trim_journal dropping the PII snapshot.
    IF OLD.status IN ('completed', 'failed', 'cancelled', 'dead') THEN
        IF NEW.request_snapshot IS NULL
           AND (to_jsonb(NEW) - 'request_snapshot' - 'updated_at')
               = (to_jsonb(OLD) - 'request_snapshot' - 'updated_at') THEN
            RETURN NULL;
        END IF;
        RAISE EXCEPTION 'run % is % and terminal states are sticky', OLD.id, OLD.status
            USING ERRCODE = 'integrity_constraint_violation',
                  HINT = 'A terminal run can be run again only as a new run: runrow.retry_run().';
    END IF;
    -- Identity of a run never changes.
    IF NEW.id <> OLD.id
       OR NEW.conversation_id <> OLD.conversation_id
       OR NEW.user_message_id <> OLD.user_message_id
       OR NEW.prompt_id <> OLD.prompt_id
       OR NEW.model <> OLD.model
       OR NEW.created_at <> OLD.created_at
       OR NEW.enqueue_seq <> OLD.enqueue_seq THEN
        RAISE EXCEPTION 'run %: id, conversation, message, model, prompt and created_at are immutable', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    -- Status moves only along the lifecycle of SPEC.md.
    IF NEW.status <> OLD.status AND NOT (
        (OLD.status = 'queued' AND NEW.status IN ('running', 'cancelled'))
        -- A run of a tenant over its daily budget is not started: failed at claim, with why.
        OR (OLD.status = 'queued' AND NEW.status = 'failed' AND NEW.budget_exhausted IS NOT NULL)
        OR (OLD.status = 'running' AND NEW.status IN ('queued', 'waiting', 'completed', 'failed', 'cancelled', 'dead'))
        OR (OLD.status = 'waiting' AND NEW.status IN ('queued', 'cancelled'))
    ) THEN
        RAISE EXCEPTION 'run %: illegal status change % -> %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END
$fn$;

COMMENT ON FUNCTION runrow._agent_run_guard() IS
'agent_run''s AFTER UPDATE row trigger (invariant 2 and the lifecycle): the statement fails with '
'23000 if it edits a terminal run (only dropping request_snapshot is allowed), changes a run''s '
'identity (id, conversation, message, prompt, model, created_at, enqueue_seq) or moves a status '
'off SPEC.md''s lifecycle. Its WHEN clause skips the call when none of that can apply. An AFTER '
'trigger, so no row is locked ahead of its update for it (migration 0030); writers stamp '
'updated_at themselves.';

DROP TRIGGER agent_run_guard ON runrow.agent_run;
CREATE TRIGGER agent_run_guard
AFTER UPDATE ON runrow.agent_run
FOR EACH ROW
WHEN (
    old.status IN ('completed', 'failed', 'cancelled', 'dead')
    OR new.id <> old.id
    OR new.conversation_id <> old.conversation_id
    OR new.user_message_id <> old.user_message_id
    OR new.prompt_id <> old.prompt_id
    OR new.model <> old.model
    OR new.created_at <> old.created_at
    OR new.enqueue_seq <> old.enqueue_seq
    OR (
        new.status <> old.status
        AND NOT (
            (old.status = 'queued' AND new.status IN ('running', 'cancelled'))
            OR (old.status = 'queued' AND new.status = 'failed' AND new.budget_exhausted IS NOT NULL)
            OR (old.status = 'running' AND new.status IN ('queued', 'waiting', 'completed', 'failed', 'cancelled', 'dead'))
            OR (old.status = 'waiting' AND new.status IN ('queued', 'cancelled'))
        )
    )
)
EXECUTE FUNCTION runrow._agent_run_guard();

DROP TRIGGER agent_run_concurrency_limit ON runrow.agent_run;
DROP FUNCTION runrow._enforce_concurrency_limit();

CREATE OR REPLACE FUNCTION runrow._agent_run_after_update() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    starts boolean;
    capped boolean;
    ends boolean;
    bad record;
    e record;
    k record;
    cap integer;
    open_runs integer;
    marked boolean;
BEGIN
    -- Most statements neither start nor end a run (a heartbeat, a mark): one look at their rows.
    SELECT (SELECT bool_or(o.status = 'queued') FROM old_runs AS o),
           (SELECT bool_or(n.concurrency_key IS NOT NULL) FROM new_runs AS n WHERE n.status = 'running'),
           (SELECT bool_or(n.status IN ('completed', 'failed', 'cancelled', 'dead')) FROM new_runs AS n)
    INTO starts, capped, ends;

    IF starts THEN
        -- Turn order: no run this statement moved from queued to running has an earlier turn
        -- of its conversation still queued. The earlier turns are read as "open"
        -- (agent_run_open_by_conversation) and tested for queued outside the query: a query on
        -- status = 'queued' can also be served by agent_run_claimable, which walks the whole
        -- queue ahead of the run (0009's header).
        SELECT n.id, n.conversation_id INTO bad
        FROM new_runs AS n
        JOIN old_runs AS o ON o.id = n.id
        WHERE n.status = 'running' AND o.status = 'queued'
          AND 'queued' = ANY (ARRAY(
              SELECT earlier.status FROM runrow.agent_run AS earlier
              WHERE earlier.conversation_id = n.conversation_id
                AND earlier.status IN ('queued', 'running', 'waiting')
                AND earlier.enqueue_seq < n.enqueue_seq
          ))
        LIMIT 1;
        IF FOUND THEN
            -- 40001: a concurrent enqueue committed an earlier turn after the claimer's
            -- snapshot; the claim treats it like any serialization failure and retries later.
            RAISE EXCEPTION 'run %: an earlier turn of conversation % is still queued', bad.id, bad.conversation_id
                USING ERRCODE = 'serialization_failure';
        END IF;
    END IF;

    IF starts AND capped THEN
        -- Concurrency caps: never more running or waiting runs of a key than its limit. The
        -- limit row's lock (taken in key order) serializes the starts of one key; the count
        -- takes a fresh snapshot after it, so it sees every start committed before the lock
        -- was granted, and this statement's own.
        FOR k IN
            SELECT n.concurrency_key AS key, min(n.id::text) AS run_id
            FROM new_runs AS n
            JOIN old_runs AS o ON o.id = n.id
            WHERE o.status = 'queued' AND n.status = 'running' AND n.concurrency_key IS NOT NULL
            GROUP BY n.concurrency_key
            ORDER BY n.concurrency_key
        LOOP
            UPDATE runrow.concurrency_limit AS l SET last_claimed_at = now()
            WHERE l.concurrency_key = k.key
            RETURNING l.max_running INTO cap;
            CONTINUE WHEN NOT FOUND;
            SELECT count(*) INTO open_runs FROM (
                SELECT 1 FROM runrow.agent_run AS a
                WHERE a.concurrency_key = k.key AND a.status IN ('running', 'waiting')
                LIMIT cap + 1
            ) AS o;
            IF open_runs > cap THEN
                RAISE EXCEPTION 'run %: concurrency key "%" is at its limit of % running or waiting runs',
                    k.run_id, k.key, cap
                    USING ERRCODE = 'check_violation', CONSTRAINT = 'agent_run_concurrency_limit';
            END IF;
        END LOOP;
    END IF;

    IF ends THEN
        -- Each run this statement ended, with what its ending may let start: a slot of a
        -- capped concurrency key, and the conversation's oldest open turn after it (only a
        -- younger turn can have waited on it; an older open one was ahead of it all along).
        FOR e IN
            SELECT n.conversation_id,
                   n.concurrency_key IS NOT NULL AND o.status IN ('running', 'waiting') AND EXISTS (
                       SELECT 1 FROM runrow.concurrency_limit AS l WHERE l.concurrency_key = n.concurrency_key
                   ) AS frees_slot,
                   t.id AS next_id,
                   t.status = 'queued' AND t.enqueue_seq > n.enqueue_seq AS next_waits
            FROM new_runs AS n
            JOIN old_runs AS o ON o.id = n.id
            LEFT JOIN LATERAL (
                SELECT x.id, x.enqueue_seq, x.status
                FROM runrow.agent_run AS x
                WHERE x.conversation_id = n.conversation_id
                  AND x.status IN ('queued', 'running', 'waiting')
                ORDER BY x.enqueue_seq
                LIMIT 1
            ) AS t ON true
            WHERE o.status IN ('queued', 'running', 'waiting')
              AND n.status IN ('completed', 'failed', 'cancelled', 'dead')
            ORDER BY n.conversation_id, n.enqueue_seq
        LOOP
            IF e.frees_slot THEN
                -- A dispatcher may be idle waiting for exactly that slot, in any conversation.
                PERFORM pg_notify('runrow_enqueued', e.conversation_id::text);
            END IF;
            CONTINUE WHEN NOT coalesce(e.next_waits, false);
            -- Locked even when unmarked: a claim that read this turn as blocked before we ended
            -- the previous one must not mark it after we looked (it locks FOR UPDATE SKIP LOCKED).
            SELECT x.claim_blocked INTO marked FROM runrow.agent_run AS x
            WHERE x.id = e.next_id AND x.status = 'queued'
            FOR KEY SHARE;
            IF marked THEN
                UPDATE runrow.agent_run AS x SET claim_blocked = false, updated_at = now() WHERE x.id = e.next_id;
            END IF;
            -- The turn that waited on this one may start now (sent once per conversation and
            -- transaction: PostgreSQL folds identical notifications of one transaction).
            PERFORM pg_notify('runrow_enqueued', e.conversation_id::text);
        END LOOP;
    END IF;
    RETURN NULL;
END
$fn$;

COMMENT ON FUNCTION runrow._agent_run_after_update() IS
'agent_run''s AFTER UPDATE statement trigger, once per statement over its old and new rows. '
'Turn order: the statement fails with 40001 if any run it moved from queued to running has an '
'earlier turn of its conversation still queued (read after the statement''s own writes, with a '
'fresh snapshot), so a turn never starts before an earlier one, whoever writes the table. '
'Concurrency caps (since 0030): for each key with a concurrency_limit row that the statement '
'started runs of, the limit row is locked (key order) and the statement fails with 23514 '
'(constraint agent_run_concurrency_limit) if the key then has more running or waiting runs '
'than its limit. Unblocking: for each run it moved to a terminal state, in (conversation, '
'turn) order, the conversation''s oldest open turn, if queued and younger, is locked FOR KEY '
'SHARE, its claim_blocked mark cleared and runrow_enqueued sent; an ended run of a concurrency '
'key that has a limit sends runrow_enqueued too (a slot came free).';
