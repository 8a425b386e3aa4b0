-- depends: 0027_uuidv7_plpgsql
-- agent_run's two AFTER UPDATE jobs, turn order and unblocking the next turn, in one trigger
-- that fires once per statement (issue 11). agent_run_unblock_next_turn was a row trigger: a
-- PL/pgSQL call and two statements (the concurrency-key test, whose EXISTS made it a full
-- statement, and the next-turn lookup) for every run that ended, ten of each for a
-- finish_runs of ten. A second statement trigger beside agent_run_turn_order would have cost
-- a call on every UPDATE statement (each claim, each heartbeat), so the two are one function:
-- one look at the statement's rows decides which of the two checks it needs, and an ending
-- batch is read in one statement.
--
-- Unchanged: what each job does and in which order it locks. Turn order still fails the
-- statement with 40001; each ended run's next open turn of its conversation is still locked
-- FOR KEY SHARE, its claim_blocked mark cleared and runrow_enqueued sent as before, the runs
-- taken in (conversation, turn) order, the order stop_conversation locks in.
--
-- Measured (tests/test_after_update_cost.py; one session, claim_runs then finish_runs, 2,000
-- runs): see the commit message.

CREATE FUNCTION runrow._agent_run_after_update() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    starts boolean;
    ends boolean;
    bad record;
    e record;
    marked boolean;
BEGIN
    -- Most statements neither start nor end a run (a heartbeat, a mark): one look at their rows.
    SELECT (SELECT bool_or(o.status = 'queued') FROM old_runs AS o),
           (SELECT bool_or(n.status IN ('completed', 'failed', 'cancelled', 'dead')) FROM new_runs AS n)
    INTO starts, ends;

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
                UPDATE runrow.agent_run AS x SET claim_blocked = false WHERE x.id = e.next_id;
            END IF;
            -- The turn that waited on this one may start now (sent once per conversation and
            -- transaction: PostgreSQL folds identical notifications of one transaction).
            PERFORM pg_notify('runrow_enqueued', e.conversation_id::text);
        END LOOP;
    END IF;
    RETURN NULL;
END
$fn$;

REVOKE ALL ON FUNCTION runrow._agent_run_after_update() FROM PUBLIC;

COMMENT ON FUNCTION runrow._agent_run_after_update() IS
'agent_run''s AFTER UPDATE statement trigger, once per statement over its old and new rows. '
'Turn order: the statement fails with 40001 if any run it moved from queued to running has an '
'earlier turn of its conversation still queued (read after the statement''s own writes, with a '
'fresh snapshot), so a turn never starts before an earlier one, whoever writes the table. '
'Unblocking: for each run it moved to a terminal state, in (conversation, turn) order, the '
'conversation''s oldest open turn, if queued and younger, is locked FOR KEY SHARE, its '
'claim_blocked mark cleared and runrow_enqueued sent; an ended run of a concurrency key that has '
'a limit sends runrow_enqueued too (a slot came free).';

DROP TRIGGER agent_run_turn_order ON runrow.agent_run;
DROP TRIGGER agent_run_unblock_next_turn ON runrow.agent_run;
DROP FUNCTION runrow._agent_run_turn_order();
DROP FUNCTION runrow._unblock_next_turn();

CREATE TRIGGER agent_run_after_update
AFTER UPDATE ON runrow.agent_run
REFERENCING OLD TABLE AS old_runs NEW TABLE AS new_runs
FOR EACH STATEMENT EXECUTE FUNCTION runrow._agent_run_after_update();
