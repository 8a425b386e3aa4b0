-- depends: 0035_turns_indexed_open_and_ended
-- A conversation's open turns indexed in two parts too: the queued ones
-- (agent_run_queued_by_conversation) beside the active one, which
-- agent_run_one_active_per_conversation (invariant 1) already indexes (issue 11: WAL and index
-- inserts per lifecycle).
--
-- Why: a claim cannot be a HOT update, so its new row version enters every index whose
-- predicate it meets. A running run met two indexes of open turns per conversation:
-- agent_run_open_by_conversation (queued, running, waiting) and
-- agent_run_one_active_per_conversation (running, waiting). With the first narrowed to queued
-- runs, a claimed run enters one index fewer (the enqueue still enters the queued one, the
-- claim only the active one).
--
-- Every reader of open turns reads the two parts, with the same results:
-- - "an earlier open turn" where an active turn is checked beside it (the claim's probes, the
--   turn-order rule below, audit()) becomes "an earlier queued turn": an earlier active turn
--   is an active turn;
-- - "the oldest open turn" (the ending's wake below, get_conversation) is the active one, or
--   else the oldest queued one;
-- - "every open turn" (stop_conversation, enqueue_run's if_active, get_conversation's count) is
--   the active ones and the queued ones.
-- A query on status = 'queued' alone implies agent_run_queued_by_conversation's predicate and
-- not agent_run_claimable's (which also names claim_blocked and not_before), so none of these
-- can walk the queue.
--
-- Measured (one session draining 3,000 runs, pg_waldump): see the commit message.

DROP INDEX runrow.agent_run_open_by_conversation;

CREATE UNIQUE INDEX agent_run_queued_by_conversation ON runrow.agent_run (conversation_id, enqueue_seq)
WHERE status = 'queued';

COMMENT ON INDEX runrow.agent_run_queued_by_conversation IS
'A conversation''s queued turns in turn order. With agent_run_one_active_per_conversation (its '
'running or waiting turn) and agent_run_ended_by_conversation, every turn of a conversation '
'(migration 0036).';

COMMENT ON INDEX runrow.agent_run_ended_by_conversation IS
'A conversation''s ended turns in turn order (the history conversation_history rebuilds); with '
'agent_run_queued_by_conversation and agent_run_one_active_per_conversation, every turn of a '
'conversation (migration 0036).';

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
        -- of its conversation still queued. status = 'queued' alone implies the predicate of
        -- agent_run_queued_by_conversation, not that of agent_run_claimable (which would walk
        -- the queue ahead of the run, 0009's header): a descent of the conversation's range.
        SELECT n.id, n.conversation_id INTO bad
        FROM new_runs AS n
        JOIN old_runs AS o ON o.id = n.id
        WHERE n.status = 'running' AND o.status = 'queued'
          AND (
              SELECT 1 FROM runrow.agent_run AS earlier
              WHERE earlier.conversation_id = n.conversation_id
                AND earlier.status = 'queued'
                AND earlier.enqueue_seq < n.enqueue_seq
              LIMIT 1
          ) IS NOT NULL
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
                -- The conversation's oldest open turn: its active one, or else its oldest
                -- queued one (agent_run_one_active_per_conversation,
                -- agent_run_queued_by_conversation).
                SELECT u.id, u.enqueue_seq, u.status
                FROM (
                    SELECT x.id, x.enqueue_seq, x.status
                    FROM runrow.agent_run AS x
                    WHERE x.conversation_id = n.conversation_id
                      AND x.status IN ('running', 'waiting')
                    UNION ALL
                    (SELECT x.id, x.enqueue_seq, x.status
                     FROM runrow.agent_run AS x
                     WHERE x.conversation_id = n.conversation_id
                       AND x.status = 'queued'
                     ORDER BY x.enqueue_seq
                     LIMIT 1)
                ) AS u
                ORDER BY u.enqueue_seq
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
