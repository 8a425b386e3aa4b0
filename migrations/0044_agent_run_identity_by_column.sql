-- depends: 0043_finish_runs_input_as_arrays
-- A run's identity (id, conversation, message, prompt, model, created_at, enqueue_seq) is
-- guarded again by a row trigger gated on those columns, agent_run_identity_guard, not by
-- agent_run_after_update's first query (issue 11: the fixed cost of every claim and ending).
--
-- Why: 0042 folded the identity rule into the statement trigger with the sticky and lifecycle
-- rules. Those two can be broken by the statements that claim and end runs; identity cannot:
-- no runrow function assigns an identity column. Its seven comparisons were still compiled
-- for every claim, ending and heartbeat, 38,000 instructions a statement (python -m
-- bench.instructions). A trigger declared AFTER UPDATE OF those columns is skipped, WHEN
-- clause and all, by a statement that assigns none of them (as agent_run_identity_guard was
-- from 0033 to 0042). The rule, its message and its SQLSTATE (23000) are the same, and it still
-- holds whoever writes the table (the owner included); a terminal run whose identity is
-- changed is reported as sticky first, as before. audit() checks the trigger is there and
-- enabled.
--
-- Measured with python -m bench.instructions: see the commit message.

CREATE FUNCTION runrow._agent_run_identity_guard() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
    -- The order of agent_run_after_update's rules: sticky first.
    IF OLD.status IN ('completed', 'failed', 'cancelled', 'dead') THEN
        RAISE EXCEPTION 'run % is % and terminal states are sticky', OLD.id, OLD.status
            USING ERRCODE = 'integrity_constraint_violation',
                  HINT = 'A terminal run can be run again only as a new run: runrow.retry_run().';
    END IF;
    RAISE EXCEPTION 'run %: id, conversation, message, model, prompt and created_at are immutable', OLD.id
        USING ERRCODE = 'integrity_constraint_violation';
END
$fn$;

REVOKE ALL ON FUNCTION runrow._agent_run_identity_guard() FROM PUBLIC;

COMMENT ON FUNCTION runrow._agent_run_identity_guard() IS
'agent_run_identity_guard''s AFTER UPDATE row trigger function, fired only for a row whose '
'identity (id, conversation, message, prompt, model, created_at, enqueue_seq) changed: the '
'statement fails with 23000, as sticky if the run was terminal, else as immutable.';

CREATE TRIGGER agent_run_identity_guard
AFTER UPDATE OF id, conversation_id, user_message_id, prompt_id, model, created_at, enqueue_seq
ON runrow.agent_run
FOR EACH ROW
WHEN (
    new.id <> old.id
    OR new.conversation_id <> old.conversation_id
    OR new.user_message_id <> old.user_message_id
    OR new.prompt_id <> old.prompt_id
    OR new.model <> old.model
    OR new.created_at <> old.created_at
    OR new.enqueue_seq <> old.enqueue_seq
)
EXECUTE FUNCTION runrow._agent_run_identity_guard();

CREATE OR REPLACE FUNCTION runrow._agent_run_after_update() RETURNS trigger
LANGUAGE plpgsql
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
    hooks boolean;
    sticky boolean;
    stuck uuid;
    broken uuid;
    o_row record;
    n_row record;
BEGIN
    -- Most statements neither start a run nor end one that lets another start (a heartbeat, a
    -- mark, most finishes): one look at their rows. An ending can let a run start only if the
    -- run has a concurrency key or a younger turn of its conversation is queued (a descent of
    -- agent_run_queued_by_conversation); the rest skip the search below for what it wakes.
    -- One pass over the statement's rows, old beside new (each transition table scanned once:
    -- a scan per question read every row's columns again).
    SELECT bool_or(o.status = 'queued'),
           bool_or(n.status = 'running' AND n.concurrency_key IS NOT NULL),
           -- An ending here: a terminal new row whose old one was not (trim_journal's updates
           -- of ended runs wake nothing and write no delivery, so they probe nothing).
           bool_or(o.status IN ('queued', 'running', 'waiting') AND n.status IN ('completed', 'failed', 'cancelled', 'dead') AND (
               n.concurrency_key IS NOT NULL OR EXISTS (
                   SELECT 1 FROM runrow.agent_run AS y
                   WHERE y.conversation_id = n.conversation_id
                     AND y.status = 'queued'
                     AND y.enqueue_seq > n.enqueue_seq
               ))),
           -- An ending of a run with a webhook_url (the outbox row is written below).
           bool_or(o.status IN ('queued', 'running', 'waiting') AND n.status IN ('completed', 'failed', 'cancelled', 'dead')
                   AND n.webhook_url IS NOT NULL),
           -- Whether it wrote a terminal run (trim_journal does, or a broken writer): the
           -- sticky rule compares whole rows, so it is looked at only then (below).
           bool_or(o.status IN ('completed', 'failed', 'cancelled', 'dead')),
           -- The first row that breaks the status moves of SPEC.md, or whose id changed (an
           -- old row without its new one; agent_run_identity_guard has raised for it already).
           (array_agg(o.id) FILTER (
               WHERE n.id IS NULL
                  OR (n.status <> o.status AND NOT (
                      (o.status = 'queued' AND n.status IN ('running', 'cancelled'))
                      -- A run of a tenant over its daily budget is not started: failed at claim.
                      OR (o.status = 'queued' AND n.status = 'failed' AND n.budget_exhausted IS NOT NULL)
                      OR (o.status = 'running'
                          AND n.status IN ('queued', 'waiting', 'completed', 'failed', 'cancelled', 'dead'))
                      OR (o.status = 'waiting' AND n.status IN ('queued', 'cancelled')))))
           )[1]
    INTO starts, capped, ends, hooks, sticky, broken
    FROM old_runs AS o
    LEFT JOIN new_runs AS n ON n.id = o.id;

    IF sticky THEN
        -- Invariant 2: nothing, not even the table owner, moves a run out of a terminal state
        -- or edits it; the one change allowed is trim_journal dropping the PII snapshot.
        SELECT o.id INTO stuck FROM old_runs AS o
        LEFT JOIN new_runs AS n ON n.id = o.id
        WHERE o.status IN ('completed', 'failed', 'cancelled', 'dead')
          AND NOT coalesce(n.request_snapshot IS NULL
                           AND (to_jsonb(n) - 'request_snapshot' - 'updated_at')
                               = (to_jsonb(o) - 'request_snapshot' - 'updated_at'), false)
        LIMIT 1;
        IF FOUND THEN
            broken := stuck;
        END IF;
    END IF;

    IF broken IS NOT NULL THEN
        -- Which rule, in the order the row guard checked them until 0042: sticky, identity,
        -- lifecycle. Only a failing statement reads the row again. (A terminal row broken
        -- only by a status move is reported as sticky, as the guard did.) Identity is
        -- agent_run_identity_guard's since 0044, which fires first; the test stays for a
        -- changed id.
        SELECT o.* INTO o_row FROM old_runs AS o WHERE o.id = broken;
        SELECT n.* INTO n_row FROM new_runs AS n WHERE n.id = broken;
        IF o_row.status IN ('completed', 'failed', 'cancelled', 'dead') THEN
            RAISE EXCEPTION 'run % is % and terminal states are sticky', o_row.id, o_row.status
                USING ERRCODE = 'integrity_constraint_violation',
                      HINT = 'A terminal run can be run again only as a new run: runrow.retry_run().';
        END IF;
        IF n_row.id IS NULL OR (
            n_row.conversation_id, n_row.user_message_id, n_row.prompt_id, n_row.model, n_row.created_at,
            n_row.enqueue_seq
        ) IS DISTINCT FROM (
            o_row.conversation_id, o_row.user_message_id, o_row.prompt_id, o_row.model, o_row.created_at,
            o_row.enqueue_seq
        ) THEN
            RAISE EXCEPTION 'run %: id, conversation, message, model, prompt and created_at are immutable', o_row.id
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RAISE EXCEPTION 'run %: illegal status change % -> %', o_row.id, o_row.status, n_row.status
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;

    IF hooks THEN
        -- The outbox: a delivery for each run this statement ended that has a webhook_url, in
        -- the transaction that ended it. A subquery, so gen_random_uuid() runs once per row.
        INSERT INTO runrow.webhook_delivery (id, run_id, url, payload)
        SELECT d.delivery, d.id, d.webhook_url, jsonb_build_object(
            'id', d.delivery,
            'type', 'run.ended',
            'run_id', d.id,
            'conversation_id', d.conversation_id,
            'user_id', d.user_id,
            'status', d.status,
            'attempt', d.attempt,
            'result', d.result,
            'error', d.error,
            'metadata', d.metadata,
            'finished_at', d.finished_at)
        FROM (
            SELECT gen_random_uuid() AS delivery, n.id, n.webhook_url, n.conversation_id, n.user_id, n.status,
                   n.attempt, n.result, n.error, n.metadata, n.finished_at
            FROM new_runs AS n
            JOIN old_runs AS o ON o.id = n.id
            WHERE n.webhook_url IS NOT NULL
              AND o.status IN ('queued', 'running', 'waiting')
              AND n.status IN ('completed', 'failed', 'cancelled', 'dead')
        ) AS d
        -- Unreachable while terminal states are sticky; kept so that a second ending could
        -- never raise inside someone's terminal write.
        ON CONFLICT (run_id) DO NOTHING;
    END IF;

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
'Rules (the row guards until 0042): the statement fails with 23000 if it edits a terminal run '
'(only dropping request_snapshot is allowed: invariant 2) or moves a status off SPEC.md''s '
'lifecycle (a run''s identity is agent_run_identity_guard''s). Webhook outbox: a '
'webhook_delivery row for each run it ended that has a webhook_url. '
'Turn order: the statement fails with 40001 if any run it moved from queued to running has an '
'earlier turn of its conversation still queued (read after the statement''s own writes, with a '
'fresh snapshot), so a turn never starts before an earlier one, whoever writes the table. '
'Concurrency caps: for each key with a concurrency_limit row that the statement started runs '
'of, the limit row is locked (key order) and the statement fails with 23514 (constraint '
'agent_run_concurrency_limit) if the key then has more running or waiting runs than its limit. '
'Unblocking: for each run it moved to a terminal state, in (conversation, turn) order, the '
'conversation''s oldest open turn, if queued and younger, is locked FOR KEY SHARE, its '
'claim_blocked mark cleared and runrow_enqueued sent; an ended run of a concurrency key that has '
'a limit sends runrow_enqueued too (a slot came free).';
