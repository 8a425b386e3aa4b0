-- Tenant fairness counts the worker time a tenant's runs hold, not the claims it gets. The
-- claim advanced a tenant's virtual clock by 1 / weight per run claimed, so tenants alternated
-- claim by claim, and a tenant whose runs held a slot 100 times longer held nearly every slot
-- (8 slots, 500 runs of 5 s from A beside 3,000 of 0.05 s from B: B started 31 runs in 20 s,
-- 2,863 alone). Start-time fair queueing with service times known only at the end: the claim
-- still charges one quantum (10 ms of worker time) per run, so a burst of claims alternates;
-- the ending of each claim charges the rest of the time it held the run.
--
-- - agent_run.claimed_at: when the current (or last) claim took the run, by the database
--   clock, set by the claim and never by a client. A running run has one.
-- - fairness_charge: the charges of ended claims, one row each, written by agent_run's
--   statement trigger (every ending goes through it: finish, release, reap, defer, stop,
--   approval park, budget). Not onto fairness_tenant: a claim locks those rows in key order
--   and holds them to commit, and a transaction that ends runs and then claims (or ends runs
--   of two tenants) would lock them in another order, a deadlock. An INSERT waits on nobody.
--   The claim adds a tenant's pending charges to its clock when it reads it, and folds them
--   in (deletes them) when it writes the clock under the row's lock.
-- - fairness_tenant.vstart: the virtual time at which the tenant's latest claimed run
--   started (its clock before that run's quantum). An idle or new tenant starts at the latest
--   of the active tenants' vstart (start-time fair queueing's system virtual time), not one
--   quantum behind the most-charged clock: with charges for time, that clock runs far ahead
--   while its runs are long, and starting everyone there would make tenants alternate again.
--   Until now vstart was vtime - 1 / weight, which is what it is set to here.

ALTER TABLE runrow.agent_run ADD COLUMN claimed_at timestamptz;

COMMENT ON COLUMN runrow.agent_run.claimed_at IS
'When the current claim took the run (the last one, once it left running), by the database '
'clock: the worker time the claim held is charged to the tenant from it (fairness_charge).';

-- Runs running now were claimed before this column: their last heartbeat (the claim's moment or
-- later) stands in, so their charge errs low. A few rows (the running ones, by the index of
-- active runs), under the lock ADD COLUMN took.
UPDATE runrow.agent_run SET claimed_at = coalesce(last_heartbeat_at, updated_at)
WHERE status = 'running';

-- A running run has its claimed_at: a seventh rule of agent_run_state (one CHECK whose text is
-- one call, migration 0045), agent_run_claimed_at_when_running, tested in name order after
-- claim_iff_running. The constraint is replaced NOT VALID here (it binds every row written from
-- now on) and validated by 0077 in a transaction of its own, as 0045 and 0046 did. Its price:
-- an eighth argument in the CHECK's text, about 10,000 backend instructions on every statement
-- that writes agent_run (heartbeat 515,738 -> 529,730 with the trigger's charge look, against
-- 539,367 with this rule too; python -m bench.api_calls).
CREATE FUNCTION runrow._agent_run_state_valid(
    status text,
    attempt integer,
    max_attempts integer,
    claim_token uuid,
    worker_id text,
    claim_expires_at timestamptz,
    finished_at timestamptz,
    claimed_at timestamptz
) RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $fn$
DECLARE
    broken text;
BEGIN
    -- The first broken rule, in the order of the constraint names (PostgreSQL's order); NULL
    -- for a valid row, which evaluates each rule once, as the seven CHECKs would. A rule whose
    -- value is NULL passes, as in a CHECK.
    broken := CASE
        WHEN NOT coalesce(attempt >= 0 AND attempt <= max_attempts, TRUE)
            THEN 'agent_run_attempt_range'
        WHEN NOT coalesce((status = 'running') = (
            claim_token IS NOT NULL AND worker_id IS NOT NULL AND claim_expires_at IS NOT NULL
        ), TRUE)
            THEN 'agent_run_claim_iff_running'
        WHEN NOT coalesce(status <> 'running' OR claimed_at IS NOT NULL, TRUE)
            THEN 'agent_run_claimed_at_when_running'
        WHEN NOT coalesce((status IN ('completed', 'failed', 'cancelled', 'dead')) = (finished_at IS NOT NULL), TRUE)
            THEN 'agent_run_finished_iff_terminal'
        WHEN NOT coalesce(status = 'running' OR (claim_token IS NULL AND claim_expires_at IS NULL), TRUE)
            THEN 'agent_run_no_claim_unless_running'
        WHEN NOT coalesce(status <> 'running' OR attempt >= 1, TRUE)
            THEN 'agent_run_running_has_attempt'
        WHEN NOT coalesce(status IN ('queued', 'running', 'waiting', 'completed', 'failed', 'cancelled', 'dead'), TRUE)
            THEN 'agent_run_status_check'
    END;
    IF broken IS NULL THEN
        RETURN TRUE;
    END IF;
    RAISE EXCEPTION 'new row for relation "agent_run" violates check constraint "%"', broken
        USING ERRCODE = 'check_violation', CONSTRAINT = broken, TABLE = 'agent_run', SCHEMA = 'runrow';
END
$fn$;

REVOKE ALL ON FUNCTION runrow._agent_run_state_valid(
    text, integer, integer, uuid, text, timestamptz, timestamptz, timestamptz
) FROM PUBLIC;

COMMENT ON FUNCTION runrow._agent_run_state_valid(
    text, integer, integer, uuid, text, timestamptz, timestamptz, timestamptz
) IS
'The expression of agent_run''s CHECK constraint agent_run_state: TRUE when the row meets the seven '
'rules (attempt_range: 0 <= attempt <= max_attempts; claim_iff_running: running exactly when '
'claim_token, worker_id and claim_expires_at are all set; claimed_at_when_running: a running run '
'has claimed_at (0076); finished_iff_terminal: finished_at set '
'exactly when the status is terminal; no_claim_unless_running: no token or lease unless running; '
'running_has_attempt: a running run is at attempt 1 or more; status_check: a known status), a '
'rule whose value is NULL passing as in a CHECK. Otherwise it raises 23514 naming the first '
'broken rule, in name order, as agent_run_<rule>, with the message PostgreSQL gives a failed '
'CHECK. IMMUTABLE: it reads its arguments only.';

ALTER TABLE runrow.agent_run
DROP CONSTRAINT agent_run_state,
ADD CONSTRAINT agent_run_state CHECK (
    runrow._agent_run_state_valid(
        status, attempt, max_attempts, claim_token, worker_id, claim_expires_at, finished_at, claimed_at
    )
) NOT VALID;

DROP FUNCTION runrow._agent_run_state_valid(text, integer, integer, uuid, text, timestamptz, timestamptz);

-- Not secret (migration 0073: a new column is not the auditor's until granted).
GRANT SELECT (claimed_at) ON runrow.agent_run TO runrow_auditor;

ALTER TABLE runrow.fairness_tenant ADD COLUMN vstart double precision;
UPDATE runrow.fairness_tenant SET vstart = vtime - 1 / weight;
ALTER TABLE runrow.fairness_tenant
ALTER COLUMN vstart SET DEFAULT -1,
ALTER COLUMN vstart SET NOT NULL,
ADD CONSTRAINT fairness_tenant_vstart_finite CHECK (vstart > '-Infinity' AND vstart < 'Infinity'),
ADD CONSTRAINT fairness_tenant_vtime_finite CHECK (vtime > '-Infinity' AND vtime < 'Infinity');

COMMENT ON TABLE runrow.fairness_tenant IS
'Per tenant (fairness key; '''' = anonymous): its weight (set_fairness_weight) and its virtual '
'clock of service, written by the claim: vtime advances by 1 / weight per run claimed and by '
'the worker time the run then held (fairness_charge, folded in by the claim), vstart is the '
'clock at which its latest claimed run started. A tenant with no row has weight 1.';

CREATE TABLE runrow.fairness_charge (
    id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    fairness_key text NOT NULL,
    -- Quanta of 10 ms beyond the one the claim charged, over the tenant's weight.
    units double precision NOT NULL CHECK (units > 0 AND units < 'Infinity'),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX fairness_charge_by_tenant ON runrow.fairness_charge (fairness_key);

GRANT SELECT ON runrow.fairness_charge TO runrow_auditor;

COMMENT ON TABLE runrow.fairness_charge IS
'Worker time of ended claims not yet folded into their tenant''s clock: written by agent_run''s '
'statement trigger as a claim ends (only for a tenant whose fairness_tenant row a claim wrote '
'while the run was held), read and deleted by the claim under the tenant row''s lock.';

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
    charges boolean;
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
           -- A claim ended here (finished, released, reaped, deferred, stopped, parked): the
           -- worker time it held is charged to its tenant's clock (below).
           bool_or(o.status = 'running' AND n.status <> 'running'),
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
    INTO starts, capped, ends, hooks, sticky, charges, broken
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

    -- Fairness by worker time: each claim this statement ended charges its tenant the time
    -- it held the run (database clock: now() - claimed_at) in quanta of 10 ms, less the one
    -- quantum the claim charged already, over the tenant's weight. Written as a row of its
    -- own, never onto fairness_tenant: claims lock those rows in key order and hold them to
    -- commit, and an ending in a transaction that then claims (finish_and_claim_runs, or
    -- finish_runs and claim_runs in one transaction) or ends runs of two tenants would lock
    -- them in another order (a deadlock). An INSERT waits on nobody; the claim adds the
    -- pending charges to each tenant's clock when it reads it and folds them in when it
    -- writes it, under the row's lock. Only for a tenant whose clock a claim wrote while the
    -- run was held (updated_at >= claimed_at: a claim that chose between tenants, or
    -- set_fairness_weight): a lone tenant's clock is not advanced, so a single-tenant queue
    -- writes no charge, and a tenant's pending charges never outnumber the runs it held
    -- when its clock was last written. Looked at only while some tenant has a clock: a
    -- single-tenant queue's endings run no INSERT (finish_run 845,328 -> 886,342 backend
    -- instructions, against 950,405 with the INSERT run on every ending; bench.api_calls).
    -- Two tests, not one: "charges AND EXISTS (...)" is a query, run by every statement (a
    -- heartbeat's too), where "charges" alone is a simple expression.
    IF charges THEN
        IF EXISTS (SELECT FROM runrow.fairness_tenant) THEN
            INSERT INTO runrow.fairness_charge (fairness_key, units)
            SELECT f.fairness_key,
                   (extract(EPOCH FROM now() - o.claimed_at)::double precision / 0.01 - 1) / f.weight
            FROM old_runs AS o
            JOIN new_runs AS n ON n.id = o.id
            JOIN runrow.fairness_tenant AS f ON f.fairness_key = coalesce(o.fairness_key, '')
            WHERE o.status = 'running' AND n.status <> 'running'
              AND f.updated_at >= o.claimed_at
              AND o.claimed_at < now() - interval '10 milliseconds';
        END IF;
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
'a limit sends runrow_enqueued too (a slot came free). '
'Fairness by worker time: for each running run it moved out of running whose tenant''s '
'fairness_tenant row was written since the run was claimed, a fairness_charge row of '
'((now() - claimed_at) / 10 ms - 1) / weight, when the run was held longer than 10 ms.';
