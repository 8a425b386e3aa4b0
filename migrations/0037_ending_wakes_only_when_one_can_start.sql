-- depends: 0036_open_turns_indexed_queued_and_active
-- agent_run's AFTER UPDATE statement trigger looks for what an ending wakes only when the
-- ending can wake something (issue 11: the fixed cost of a finish).
--
-- Why: the trigger fires once per UPDATE statement, and at batch 1 a finish is one run per
-- statement, so what the trigger costs to start is paid per run. For every statement that
-- ended a run it ran the search for the conversation's oldest open turn (a LATERAL union of
-- the active turn and the oldest queued one, with a capped-key check): a dozen plan nodes
-- started for each finish, about 85 us of the 1,275 us of backend CPU a chained batch-1
-- lifecycle cost. An ending wakes a run only if the ended run has a concurrency key (a slot
-- comes free) or a younger turn of its conversation is queued (the only turn that can have
-- waited on it): the router's one look now checks that for each ended run, with one descent
-- of agent_run_queued_by_conversation, and the search runs only when one of them holds. Its
-- results are unchanged; only statements whose search would have found nothing skip it.
--
-- Measured (one session, chained claim_runs + finish_runs): see the commit message.

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
    -- Most statements neither start a run nor end one that lets another start (a heartbeat, a
    -- mark, most finishes): one look at their rows. An ending can let a run start only if the
    -- run has a concurrency key or a younger turn of its conversation is queued (a descent of
    -- agent_run_queued_by_conversation); the rest skip the search below for what it wakes.
    SELECT (SELECT bool_or(o.status = 'queued') FROM old_runs AS o),
           (SELECT bool_or(n.concurrency_key IS NOT NULL) FROM new_runs AS n WHERE n.status = 'running'),
           (SELECT bool_or(n.concurrency_key IS NOT NULL OR EXISTS (
                SELECT 1 FROM runrow.agent_run AS y
                WHERE y.conversation_id = n.conversation_id
                  AND y.status = 'queued'
                  AND y.enqueue_seq > n.enqueue_seq
            ))
            FROM new_runs AS n
            WHERE n.status IN ('completed', 'failed', 'cancelled', 'dead'))
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
