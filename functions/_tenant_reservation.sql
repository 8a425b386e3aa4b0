-- A budgeted tenant's model calls in flight (migration 0088): each grant's reservation is a
-- row of tenant_reservation, summed on the tenant's budget row by the table's trigger, and
-- acquire_model_call decides with the settled spend plus that sum. Private helpers, as in
-- functions/_limits_helpers.sql: no SET clauses, granted to no role.

-- May the run's call, reserving `reserved` ({input_tokens, output_tokens}, acquire_model_call's
-- worst case), go as far as its tenant's budget is concerned? NULL: yes, and the reservation
-- is counted (replacing one the run's last claim left unsettled); 'budget_reserved': wait, the
-- settled spend plus the reservations of the tenant's other calls in flight plus this one would
-- pass the budget (they may settle lower; alone, a call goes, as a run's one step always could,
-- so the tenant passes its budget by one call's reservation at most); else the budget is spent,
-- settled, and the reason to end the run. The budget row is locked to the end of the caller's
-- transaction (after the key's bucket row: the order of every settle), so two grants racing for
-- the last of a budget decide one after the other, the second counting the first.
-- First come, first served (migration 0091): the first call told to wait is kept on the budget
-- row (waiter_run, its reservation, its latest ask), and while it waits another call goes only if
-- it fits beside the waiter's reservation too, so the calls in flight drain and the waiter goes;
-- before, smaller calls taking turns in flight kept a large one waiting forever. A waiter is
-- forgotten when granted, or once its run is no longer queued or running, or held and silent for
-- a minute, or queued and due for five minutes (acquire_model_call tells it to wait 15 s, and the
-- worker defers the run for that; migration 0097), due at most a minute after its last ask
-- (migration 0099).
CREATE OR REPLACE FUNCTION runrow._tenant_reserve(r runrow.agent_run, reserved jsonb)
RETURNS text
LANGUAGE plpgsql
AS $fn$
DECLARE
    b runrow.tenant_budget;
    spent record;
    why text;
    p runrow.model_price;
    inp bigint := (_tenant_reserve.reserved ->> 'input_tokens')::bigint;
    outp bigint := (_tenant_reserve.reserved ->> 'output_tokens')::bigint;
    cost numeric := 0;
    -- The tenant's day with this call: settled plus this call's reservation.
    day_tokens numeric;
    day_cost numeric;
    -- Another run's call waits for room (b.waiter_run): this one goes only beside it.
    beside boolean;
    -- That waiter is still there (its run held or queued, and not silent too long: below).
    behind boolean := false;
    pruned boolean := false;
BEGIN
    SELECT t.* INTO b FROM runrow.tenant_budget AS t WHERE t.fairness_key = r.fairness_key FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- Read under the lock: a settle that committed before it is in the spend, and its
    -- reservation out of the total, never one without the other.
    spent := runrow._tenant_spent(b.fairness_key);
    why := runrow._tenant_over(b, spent.tokens, spent.cost);
    IF why IS NOT NULL THEN
        RETURN why;
    END IF;
    SELECT m.* INTO p FROM runrow.model_price AS m WHERE m.model = r.model;
    IF FOUND THEN
        cost := (inp * p.input_per_mtok + outp * p.output_per_mtok) / 1000000;
    END IF;
    day_tokens := spent.tokens + inp + outp;
    day_cost := spent.cost + cost;

    -- The one room test: this call, beside the calls in flight (and the waiter's, if another
    -- call waits), in the budget. Alone (nothing reserved, nobody else waiting) a call goes.
    -- Failing it, what holds nothing back any more goes and it is made again: at most a waiter
    -- that went away, then the stale reservations; so at most three passes.
    LOOP
        beside := b.waiter_run IS NOT NULL AND b.waiter_run <> r.id;
        EXIT WHEN (b.reserved_tokens = 0 AND NOT beside) OR runrow._tenant_room(b,
            day_tokens + b.reserved_tokens + CASE WHEN beside THEN b.waiter_tokens ELSE 0 END,
            day_cost + b.reserved_cost + CASE WHEN beside THEN b.waiter_cost ELSE 0 END);
        IF beside AND NOT behind THEN
            -- Its run is held and asked within the minute, or it is queued (deferred for its
            -- wait, then waiting for a free slot) and was due less than five minutes ago: the
            -- minute counted from its last ask dropped it when a saturated fleet took longer
            -- than 45 s past the deferral's 15 s to claim it again, and smaller calls took the
            -- room once more. Due: not_before while deferred (a later deferral of the run, for
            -- a rate limit, moves it on); once a claim promoted it (not_before cleared), its
            -- last ask is the bound's start, 15 s before it was due. Five minutes, not forever:
            -- a run no claim reaches (a low priority under constant load, a key blocked for
            -- hours) must not hold its tenant's room idle for good. Nor a run deferred far for
            -- another reason (a 429's retry-after, up to a day; a claim holding it to its key's
            -- block): due counts as at most a minute after its last ask (its 15 s deferral and
            -- some), so a waiter deferred for hours held every other call of its tenant to the
            -- room beside its reservation, nothing in flight, for those hours (the review of
            -- 0097). Queued, a waiter holds the room at most six minutes past its last ask.
            behind := EXISTS (
                SELECT 1 FROM runrow.agent_run AS w
                WHERE w.id = b.waiter_run
                  AND (w.status = 'running' AND b.waiter_seen_at > now() - interval '1 minute'
                       OR w.status = 'queued'
                       AND least(greatest(b.waiter_seen_at, w.not_before), b.waiter_seen_at + interval '1 minute')
                       > now() - interval '5 minutes')
            );
            IF NOT behind THEN
                -- The waiter went away (its run ended, or it stopped asking): forgotten.
                UPDATE runrow.tenant_budget AS t
                SET waiter_run = NULL, waiter_tokens = NULL, waiter_cost = NULL, waiter_seen_at = NULL
                WHERE t.fairness_key = b.fairness_key
                RETURNING t.* INTO b;
                CONTINUE;
            END IF;
        END IF;
        IF pruned THEN
            -- The first to wait is the waiter (a later one waits behind it); its ask is kept fresh.
            IF NOT beside THEN
                UPDATE runrow.tenant_budget AS t
                SET waiter_run = r.id, waiter_tokens = inp + outp, waiter_cost = cost,
                    waiter_seen_at = now()
                WHERE t.fairness_key = b.fairness_key;
            END IF;
            RETURN 'budget_reserved';
        END IF;
        -- Before making it wait, the reservations that hold nothing back any more go: the run's
        -- own (its last call is over, as it asks for the next one; this one replaces it) and
        -- those of claims that ended unsettled another way than the endings that take theirs
        -- out (a run stopped or parked on a person). Read on this path only, where it pays.
        DELETE FROM runrow.tenant_reservation AS s
        WHERE s.fairness_key = b.fairness_key
          AND (s.run_id = r.id OR NOT EXISTS (
              SELECT 1 FROM runrow.agent_run AS a WHERE a.id = s.run_id AND a.claim_token = s.claim_token
          ));
        IF FOUND THEN
            SELECT t.* INTO b FROM runrow.tenant_budget AS t WHERE t.fairness_key = b.fairness_key;
        END IF;
        pruned := true;
    END LOOP;

    IF b.waiter_run = r.id THEN
        UPDATE runrow.tenant_budget AS t
        SET waiter_run = NULL, waiter_tokens = NULL, waiter_cost = NULL, waiter_seen_at = NULL
        WHERE t.fairness_key = b.fairness_key;
    END IF;
    INSERT INTO runrow.tenant_reservation AS s (run_id, fairness_key, claim_token, tokens, cost)
    VALUES (r.id, b.fairness_key, r.claim_token, inp + outp, cost)
    ON CONFLICT ON CONSTRAINT tenant_reservation_pkey DO UPDATE
    SET fairness_key = excluded.fairness_key, claim_token = excluded.claim_token,
        tokens = excluded.tokens, cost = excluded.cost;
    RETURN NULL;
END
$fn$;

-- Does a rolling day of `tokens` and `cost` (spent, reserved and asked for) fit budget b?
CREATE OR REPLACE FUNCTION runrow._tenant_room(b runrow.tenant_budget, tokens numeric, cost numeric)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT (b.tokens_per_day IS NULL OR _tenant_room.tokens <= b.tokens_per_day)
        AND (b.cost_per_day IS NULL OR _tenant_room.cost <= b.cost_per_day);
$fn$;

-- The run's call is done with (settled, charged at the reap, refused, or its claim handed
-- back): its reservation leaves its tenant's total. The tenant's budget row is locked before
-- the reservation's row, as a grant locks them, so the two never wait on each other crosswise;
-- callers that hold a key's bucket row took it first, as a grant does. A run with nothing
-- counted (most: a tenant without a budget) costs one probe of a small table.
CREATE OR REPLACE FUNCTION runrow._tenant_unreserve(run_id uuid)
RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    key text;
BEGIN
    SELECT s.fairness_key INTO key FROM runrow.tenant_reservation AS s WHERE s.run_id = _tenant_unreserve.run_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM 1 FROM runrow.tenant_budget AS b WHERE b.fairness_key = key FOR UPDATE;
    DELETE FROM runrow.tenant_reservation AS s WHERE s.run_id = _tenant_unreserve.run_id;
END
$fn$;

-- _tenant_unreserve for a batch of ended runs (finish_runs, finish_and_claim_runs): called
-- only for the runs of tenants with a budget, the only ones a call can be reserved for. A
-- batch spans tenants, so their budget rows are locked in key order: two batches ending runs
-- of the same tenants never wait on each other crosswise. The callers read no column or table
-- a recent migration added (tests/test_upgrade_0061.py runs them on an older schema): this
-- body is planned only when called.
CREATE OR REPLACE FUNCTION runrow._tenant_unreserve_runs(run_ids uuid[])
RETURNS void
LANGUAGE plpgsql
AS $fn$
BEGIN
    PERFORM 1 FROM runrow.tenant_budget AS b
    WHERE b.fairness_key IN (
        SELECT s.fairness_key FROM runrow.tenant_reservation AS s WHERE s.run_id = ANY (_tenant_unreserve_runs.run_ids)
    )
    ORDER BY b.fairness_key
    FOR UPDATE;
    IF FOUND THEN
        DELETE FROM runrow.tenant_reservation AS s WHERE s.run_id = ANY (_tenant_unreserve_runs.run_ids);
    END IF;
END
$fn$;

REVOKE ALL ON FUNCTION runrow._tenant_reserve(runrow.agent_run, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._tenant_unreserve_runs(uuid[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._tenant_unreserve(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._tenant_room(runrow.tenant_budget, numeric, numeric) FROM PUBLIC;
