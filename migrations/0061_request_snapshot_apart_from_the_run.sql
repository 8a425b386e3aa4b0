-- depends: 0060_journal_pages_keep_a_reserve
-- A run's request snapshot (its user message content and metadata: the PII copy that
-- trim_journal drops) lives in a table of its own, run_request, not in agent_run (issue 11:
-- WAL per lifecycle with a history; history that stays cheap).
--
-- Why: the snapshot was a column of agent_run, so every version of the run's row carried it.
-- The claim and the finish cannot be HOT updates, and each writes a new version of the whole
-- row; when that version does not fit on the row's page it goes to another page, whose first
-- change after a checkpoint logs the whole page. A row as wide as the user's message fills a
-- page with few runs, and so the lifecycle paid full-page images in proportion to the message:
-- with a 1,000-character message, 200,000 runs done before and 20,000 drained at batch 10
-- right after a CHECKPOINT, 5,879 bytes of WAL and 0.61 of agent_run's page images per run,
-- against 2,112 and 0.11 with the snapshot out of the row (the same drain). The message itself
-- is in runrow.message already; the snapshot is a second copy kept for trim_journal to drop.
--
-- Also: trim_journal no longer writes agent_run at all. It nulled the snapshot, a non-HOT
-- update of every trimmed run that moved its finished_at entry from agent_run_untrimmed to
-- agent_run_trimmed (migration 0040). Now it deletes the run's run_request row, and a finished
-- run's row is never written again: agent_run's two indexes of finished runs are one,
-- agent_run_finished, and a terminal run admits no change at all (invariant 2 without its one
-- exception).
--
-- trim_journal's work list: run_request's own key is a UUIDv7 made when the row is written (at
-- the enqueue), so it orders the untrimmed runs by enqueue time, and a run that ended before
-- the cutoff was enqueued before it. trim_journal walks that key up to the cutoff's
-- millisecond and takes the runs that ended before the cutoff: it reads the untrimmed runs
-- enqueued before the cutoff, never the trimmed history. (Not run_id as the key: ids of runs
-- made before migration 0020 are random UUIDv4, in no time order; a row backfilled here gets
-- a key of now, and is trimmed at most one older_than later than it would have been.)
--
-- Cost of upgrading: one INSERT of every untrimmed snapshot into run_request and one UPDATE
-- nulling them in agent_run (a trimming deployment holds about a day of runs untrimmed), then
-- DROP COLUMN (catalog only) and one index build over the finished runs, under agent_run's
-- ACCESS EXCLUSIVE lock (about 1 s per 100,000 runs on a 2-core box). The nulling is there
-- so no copy of the PII is left in agent_run's live rows: a dropped column's bytes stay in
-- every row until it is rewritten. An enqueue, retry or fork that lands between this
-- migration's commit and the functions' (the same `runrow migrate`) fails with 42703 and can
-- be retried; pause writers around the upgrade if that is not acceptable.
--
-- Measured: see the commit message.

CREATE TABLE runrow.run_request (
    id uuid PRIMARY KEY,  -- stamped by run_request_guard from the database clock
    run_id uuid NOT NULL UNIQUE,
    snapshot jsonb NOT NULL
);

COMMENT ON TABLE runrow.run_request IS
'The request each run was enqueued with (its user message content and metadata), one row per '
'run until trim_journal deletes it with the run''s journal. id is a UUIDv7 of the insert''s now(), '
'whatever the writer gave (run_request_guard): trim_journal''s work list, in enqueue order. '
'Written by enqueue_run, retry_run and fork_run; rows are never updated, and only those of '
'terminal runs are deleted.';

-- A request's key is stamped here from the database clock, whatever a writer gave:
-- trim_journal's walk takes every run that ended before its cutoff from the keys below the
-- cutoff, which holds only if no key is later than its run's enqueue. And the run it belongs
-- to is checked by one lookup without a lock, not by a foreign key, whose check key-share locks
-- the run's row: a Heap/LOCK record on every enqueue, the cost migration 0052 took out of
-- agent_run's own references. A run that exists when its request is written exists as long as
-- the request does: agent_run rows are never deleted (agent_run_no_delete,
-- agent_run_no_truncate) and a run's id never changes (agent_run_identity_guard).
CREATE FUNCTION runrow._run_request_guard() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
    NEW.id := runrow._uuidv7();
    PERFORM FROM runrow.agent_run AS a WHERE a.id = NEW.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'insert or update on table "run_request" violates foreign key constraint "run_request_run_id_fkey"'
            USING ERRCODE = 'foreign_key_violation',
                  DETAIL = format('Key (run_id)=(%s) is not present in table "agent_run".', NEW.run_id),
                  CONSTRAINT = 'run_request_run_id_fkey', TABLE = 'run_request', SCHEMA = 'runrow';
    END IF;
    RETURN NEW;
END
$fn$;

COMMENT ON FUNCTION runrow._run_request_guard() IS
'run_request''s BEFORE INSERT row trigger: the row''s id becomes a UUIDv7 of now() (trim_journal''s '
'work list is in that order), and a request for a run that does not exist fails with 23503, as '
'its foreign key would (run_request_run_id_fkey), without locking the run''s row.';

REVOKE ALL ON FUNCTION runrow._run_request_guard() FROM PUBLIC;

CREATE TRIGGER run_request_guard BEFORE INSERT ON runrow.run_request
FOR EACH ROW EXECUTE FUNCTION runrow._run_request_guard();

CREATE FUNCTION runrow._run_request_no_update() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
BEGIN
    RAISE EXCEPTION 'run_request rows are never updated'
        USING ERRCODE = 'integrity_constraint_violation',
              HINT = 'A run''s request is written once, at its enqueue; trim_journal deletes it.';
END
$fn$;

COMMENT ON FUNCTION runrow._run_request_no_update() IS
'run_request''s BEFORE UPDATE statement trigger: every UPDATE fails with 23000.';

REVOKE ALL ON FUNCTION runrow._run_request_no_update() FROM PUBLIC;

CREATE TRIGGER run_request_no_update BEFORE UPDATE ON runrow.run_request
FOR EACH STATEMENT EXECUTE FUNCTION runrow._run_request_no_update();

CREATE FUNCTION runrow._run_request_deleted() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
DECLARE
    live uuid;
BEGIN
    SELECT d.run_id INTO live
    FROM gone AS d
    INNER JOIN runrow.agent_run AS a ON d.run_id = a.id
    WHERE a.status NOT IN ('completed', 'failed', 'cancelled', 'dead')
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'run % is not terminal: its request is kept until it ends', live
            USING ERRCODE = 'integrity_constraint_violation',
                  HINT = 'trim_journal drops the requests of runs that ended.';
    END IF;
    RETURN NULL;
END
$fn$;

COMMENT ON FUNCTION runrow._run_request_deleted() IS
'run_request''s AFTER DELETE statement trigger: the statement fails with 23000 if it deleted '
'the request of a run that is not terminal.';

REVOKE ALL ON FUNCTION runrow._run_request_deleted() FROM PUBLIC;

CREATE TRIGGER run_request_deleted AFTER DELETE ON runrow.run_request
REFERENCING OLD TABLE AS gone
FOR EACH STATEMENT EXECUTE FUNCTION runrow._run_request_deleted();

CREATE TRIGGER run_request_no_truncate BEFORE TRUNCATE ON runrow.run_request
FOR EACH STATEMENT EXECUTE FUNCTION runrow._no_truncate();

REVOKE ALL ON runrow.run_request FROM PUBLIC;
GRANT SELECT ON runrow.run_request TO runrow_auditor;

INSERT INTO runrow.run_request (run_id, snapshot)
SELECT
    a.id,
    a.request_snapshot
FROM runrow.agent_run AS a
WHERE a.request_snapshot IS NOT NULL
ORDER BY a.enqueue_seq;

UPDATE runrow.agent_run AS a SET request_snapshot = NULL
WHERE a.request_snapshot IS NOT NULL;

-- The views of history read agent_run_finished (below), without 0040's arm per index; replaced
-- before the column goes, since a view binds to the columns it reads.
CREATE OR REPLACE VIEW runrow.run_stats AS
-- queued and running/waiting are two partial indexes; the planner serves each arm of a
-- UNION from one, but an IN over all three statuses from neither.
WITH live AS (
    SELECT
        a.status,
        count(*) AS runs
    FROM runrow.agent_run AS a
    WHERE a.status = 'queued'
    GROUP BY a.status
    UNION ALL
    SELECT
        a.status,
        count(*) AS runs
    FROM runrow.agent_run AS a
    WHERE a.status IN ('running', 'waiting')
    GROUP BY a.status
),

recent AS (
    SELECT
        a.id,
        a.status,
        a.finished_at - a.started_at AS duration,
        st.steps
    FROM runrow.agent_run AS a
    CROSS JOIN
        LATERAL (
            SELECT count(*) AS steps
            FROM runrow.agent_step AS s
            WHERE s.run_id = a.id
        ) AS st
    WHERE
        a.finished_at >= now() - interval '24 hours'
        AND a.status IN ('completed', 'failed', 'cancelled', 'dead')
),

finished AS (
    SELECT
        coalesce(r.status, 'finished') AS status,
        count(*) AS runs,
        percentile_cont(0.5) WITHIN GROUP (ORDER BY r.steps) AS steps_p50,
        percentile_cont(0.95) WITHIN GROUP (ORDER BY r.steps) AS steps_p95,
        percentile_cont(0.5) WITHIN GROUP (ORDER BY r.duration) AS duration_p50,
        percentile_cont(0.95) WITHIN GROUP (ORDER BY r.duration) AS duration_p95
    FROM recent AS r
    GROUP BY GROUPING SETS ((r.status), ())
)

SELECT
    s.status,
    coalesce(l.runs, f.runs, 0) AS runs,
    f.steps_p50,
    f.steps_p95,
    f.duration_p50,
    f.duration_p95
FROM (
    VALUES
    (1, 'queued'), (2, 'running'), (3, 'waiting'),
    (4, 'completed'), (5, 'failed'), (6, 'cancelled'), (7, 'dead'), (8, 'finished')
) AS s (ord, status)
LEFT JOIN live AS l ON s.status = l.status
LEFT JOIN finished AS f ON s.status = f.status
ORDER BY s.ord;

COMMENT ON VIEW runrow.run_stats IS
'One row per status, always all of them. runs: for queued, running and waiting, how many are '
'in that state now; for completed, failed, cancelled and dead, how many ended so in the last '
'24 hours; finished = the four terminal statuses together. For the terminal rows (NULL for '
'the live ones): steps_p50 / steps_p95 = steps in the step log per run (percentile_cont, '
'interpolated; a run stopped before it started counts 0), duration_p50 / duration_p95 = '
'finished_at - started_at (first claim to ending, including requeues and approval waits; '
'runs that never started are left out). History is read through agent_run_finished '
'only; all-time counts are SELECT status, count(*) FROM runrow.agent_run '
'GROUP BY 1 (a full scan).';

CREATE OR REPLACE VIEW runrow.run_attempts AS
WITH counted AS (
    SELECT
        a.status,
        a.attempt
    FROM runrow.agent_run AS a
    WHERE a.status = 'queued'
    UNION ALL
    SELECT
        a.status,
        a.attempt
    FROM runrow.agent_run AS a
    WHERE a.status IN ('running', 'waiting')
    UNION ALL
    SELECT
        a.status,
        a.attempt
    FROM runrow.agent_run AS a
    WHERE
        a.finished_at >= now() - interval '24 hours'
        AND a.status IN ('completed', 'failed', 'cancelled', 'dead')
)

SELECT
    c.status,
    c.attempt,
    count(*) AS runs
FROM counted AS c
GROUP BY c.status, c.attempt
ORDER BY c.status, c.attempt;

-- One SELECT whose WHERE is an OR of what each index serves: the queued runs, the active ones
-- and the day's finished ones, so the planner unions three index scans (BitmapOr).
CREATE OR REPLACE VIEW runrow.spend_by_run AS
SELECT
    a.id AS run_id,
    a.status,
    a.fairness_key,
    a.model,
    a.spent_tokens,
    a.token_budget,
    a.spent_cost,
    a.cost_budget,
    a.budget_exhausted
FROM runrow.agent_run AS a
WHERE
    a.status = 'queued'
    OR a.status IN ('running', 'waiting')
    OR (
        a.finished_at > now() - interval '24 hours'
    );

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
           -- Whether it wrote a terminal run (only a broken writer does since 0061): the
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
        -- or edits it (since 0061 without exception: the PII snapshot is run_request's).
        SELECT o.id INTO stuck FROM old_runs AS o
        LEFT JOIN new_runs AS n ON n.id = o.id
        WHERE o.status IN ('completed', 'failed', 'cancelled', 'dead')
          AND NOT coalesce((to_jsonb(n) - 'updated_at') = (to_jsonb(o) - 'updated_at'), false)
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
'(invariant 2; a statement that leaves it unchanged but for updated_at passes) or moves a status off SPEC.md''s '
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

ALTER TABLE runrow.agent_run DROP COLUMN request_snapshot;  -- and with it agent_run_(un)trimmed

CREATE INDEX agent_run_finished ON runrow.agent_run (finished_at)
WHERE finished_at IS NOT NULL;

COMMENT ON INDEX runrow.agent_run_finished IS
'Every finished run, by finished_at: the history window of audit() and the DBA views. A run '
'enters it once, at its ending; nothing writes a finished run again.';
