-- The claim's walk of the queue, shared by _claim and finish_and_claim_runs: it checks the
-- claim's arguments, promotes due delayed runs, and locks (FOR UPDATE SKIP LOCKED) up to
-- max_runs runs that may start now, in claim order. It writes no claim: the caller's one
-- statement does, and the caller's exception block covers both, so a collision in that
-- statement rolls back the walk's locks and marks with it.
CREATE OR REPLACE FUNCTION runrow._claim_walk(
    worker_id text, max_runs integer, lease_seconds integer,
    -- The locked runs in claim order, and when each was queued, read with its lock: the time
    -- it waited, without reading the rows again in the caller's UPDATE.
    OUT locked uuid[], OUT locked_since timestamptz[]
)
LANGUAGE plpgsql
-- No SET clauses of its own: it runs under its callers' (_claim and finish_and_claim_runs set
-- the plan settings _claim explains, and the search_path). Saving and restoring five settings a
-- second time cost about 30 us per claim (A/B, claim_runs(max_runs => 10) rolled back).
AS $fn$
DECLARE
    cand record;
    got uuid;
    blocked boolean;
    -- The re-check under the lock relies on each statement's fresh snapshot, which only
    -- READ COMMITTED gives; a claim inside a REPEATABLE READ or SERIALIZABLE transaction
    -- skips blocked turns without marking them.
    may_mark boolean := current_setting('transaction_isolation') = 'read committed';
    got_since timestamptz;
    -- The concurrency key of each run in locked (parallel array), for the cap's count.
    locked_keys text[] := '{}';
    -- Limit rows this claim holds the lock of, and keys found at their limit this round.
    held_keys text[] := '{}';
    capped_keys text[] := '{}';
    cap integer;
    open_runs integer;
    -- The priority level being served (h_lvl), and its tenants in index order.
    h_lvl integer;
    t_key text[];
    -- Each tenant's oldest head seen (the first of the level's index range for the tenant
    -- until its runs are read), the tie-break between tenants of equal virtual time.
    t_head bigint[];
    -- The entry the tenant's range starts with: its first key and that key's head.
    t_ck text[];
    t_id uuid[];
    t_conv uuid[];
    ent record;
    t_vtime double precision[];
    t_weight double precision[];
    t_served integer[];
    t_live boolean[];
    t_loaded boolean[];
    vfloor double precision;
    -- The groups (tenant, concurrency key) of the loaded tenants and each group's head.
    g_tenant integer[];
    g_key text[];
    g_head_id uuid[];
    g_head_conv uuid[];
    g_head_seq bigint[];
    h_tenant text;
    h_group text;
    h_after bigint;
    best integer;
    bg integer;
    found_key text;
    promoted integer;
    -- Fleet limits (issue 13): the rate-limit keys blocked now (read once per claim from a
    -- small table), and the tenants over their daily budget, judged the first time the walk
    -- reaches each one (a claim pays for the tenants it serves, not for every budget set).
    fleet_blocked_keys text[];
    fleet_has_budgets boolean;
    fleet_checked_tenants text[] := '{}';
    fleet_over_tenants text[] := '{}';
    -- The verdict of each tenant in fleet_over_tenants (parallel array): judged once per claim.
    fleet_over_verdicts text[] := '{}';
    fleet_verdict text;
    fleet_cand record;
    fleet_held_to timestamptz;
    -- Runs this claim has set aside without claiming them, each a lock and a write: turns
    -- marked claim_blocked (behind their conversation's open turn), runs delayed for a blocked
    -- rate-limit key, runs of tenants over budget ended failed. At most walk_cap of them: a
    -- tenant with 20,000 queued runs over budget had them all failed inside one claim (3.3 s),
    -- 10,000 turns queued behind one conversation's running turn were all marked by one claim
    -- (1.0 s; 50,000: 4.7 s), 10,000 runs of a key just refused with a 429 all delayed by one
    -- (0.95 s), and past the worker's statement_timeout no claim would ever succeed (its
    -- rollback undoes the marks). Past the cap, a tenant whose next run would be set aside
    -- waits for the next claim, which goes on where this one stopped: what it set aside is out
    -- of agent_run_claimable.
    set_aside integer := 0;
    walk_cap CONSTANT integer := 500;
    -- The cap stopped the walk (or a tenant in it): no lower priority level is served this
    -- claim (priority stays strict), and the claim wakes the dispatchers when it commits, so
    -- the next claim goes on at once instead of a poll tick later (a worker that got fewer runs
    -- than it asked for waits for a wake or the tick: 10,000 blocked turns took 20 ticks).
    capped boolean := false;
    -- The batch step (one tenant, one group without a key): the free runs it locked, when each
    -- was queued, the last seq it read and how many it locked.
    want integer;
    b_ids uuid[];
    b_since timestamptz[];
    b_last bigint;
    b_n integer;
    -- Its result, read as a simple expression (see finish_and_claim_runs).
    step record;
    -- The fast path's look at the queue: its shape ('empty', 'simple' or 'other') and the
    -- first claimable entry's priority, tenant and seq.
    f_shape text;
    f_lvl integer;
    f_tenant text;
    f_seq bigint;
    -- The claimed rows, returned once the statement that claims them has succeeded.
BEGIN
    IF _claim_walk.worker_id = '' OR length(_claim_walk.worker_id) > 200 THEN
        RAISE EXCEPTION 'worker_id must be NULL or 1 to 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Journaled in run_claimed and kept as the run's worker_id, which `runrow status` and the
    -- logs show: no control character (functions/_identifier_checks.sql).
    IF NOT runrow._printable(_claim_walk.worker_id) THEN
        PERFORM runrow._require_printable(_claim_walk.worker_id, 'worker_id');
    END IF;
    -- The helpers only raise; calling them only when a test here fails keeps two function
    -- calls (each a statement and a search_path switch) off every claim.
    IF _claim_walk.max_runs IS NULL OR _claim_walk.max_runs NOT BETWEEN 1 AND 1000 THEN
        PERFORM runrow._require_range(_claim_walk.max_runs, 'max_runs', 1, 1000);
    END IF;
    IF _claim_walk.lease_seconds IS NULL OR _claim_walk.lease_seconds NOT BETWEEN 1 AND 3600 THEN
        PERFORM runrow._require_range(_claim_walk.lease_seconds, 'lease_seconds', 1, 3600);
    END IF;

    locked := '{}';
    locked_since := '{}';

    -- The fast path. A queue whose claimable runs are all one group without a concurrency key
    -- (one priority level, one tenant), with no delayed run due and no fleet limit that could
    -- bite (no blocked rate-limit key, no budget), is served by the batch step alone: the walk
    -- below would promote nothing, find no other tenant, key or level, and take the same batch
    -- step, in five statements more (issue 11: a call's work 2.33M -> 2.05M instructions). One
    -- statement looks: the first and the last entry of agent_run_claimable (one group if they
    -- are), the first of agent_run_delayed, and the two fleet tables (only when the rest
    -- holds). An empty queue ends here too, with nothing due. Only in READ COMMITTED, as the
    -- batch step; anything else takes the walk.
    IF may_mark THEN
        SELECT CASE
                   WHEN (
                       SELECT w.not_before FROM runrow.agent_run AS w
                       WHERE w.status = 'queued' AND w.not_before IS NOT NULL
                       ORDER BY w.not_before
                       LIMIT 1
                   ) <= now() THEN 'other'
                   WHEN f.seq IS NULL THEN 'empty'
                   -- Subqueries, not joins, from here: read only when the tests before them
                   -- hold (an empty claim reads the index from its head only).
                   WHEN f.ck = '' AND (f.lvl, f.fk, f.ck) = (
                       -- The last entry: agent_run_claimable read backwards.
                       SELECT q.priority, coalesce(q.fairness_key, ''), coalesce(q.concurrency_key, '')
                       FROM runrow.agent_run AS q
                       WHERE q.status = 'queued' AND NOT q.claim_blocked AND q.not_before IS NULL
                       ORDER BY q.priority, coalesce(q.fairness_key, '') DESC, coalesce(q.concurrency_key, '') DESC,
                                q.enqueue_seq DESC
                       LIMIT 1
                   ) AND NOT EXISTS (SELECT 1 FROM runrow.rate_limit AS r WHERE r.blocked_until > now())
                   AND NOT EXISTS (SELECT 1 FROM runrow.tenant_budget) THEN 'simple'
                   ELSE 'other'
               END,
               f.lvl, f.fk, f.seq
        INTO f_shape, f_lvl, f_tenant, f_seq
        FROM (SELECT) AS one
        LEFT JOIN (
            SELECT q.priority AS lvl, coalesce(q.fairness_key, '') AS fk, coalesce(q.concurrency_key, '') AS ck,
                   q.enqueue_seq AS seq
            FROM runrow.agent_run AS q
            WHERE q.status = 'queued' AND NOT q.claim_blocked AND q.not_before IS NULL
            ORDER BY q.priority DESC, coalesce(q.fairness_key, ''), coalesce(q.concurrency_key, ''), q.enqueue_seq
            LIMIT 1
        ) AS f ON true;
        IF f_shape = 'empty' THEN
            RETURN;
        ELSIF f_shape = 'simple' THEN
            -- As the walk's serve loop takes it: again past the last run read while the runs
            -- found blocked leave slots free and the group's range goes on.
            LOOP
                -- No more runs locked than the cap has room for: a step may set all of them aside.
                want := least(_claim_walk.max_runs - cardinality(locked), walk_cap - set_aside);
                step := runrow._claim_batch_step(f_lvl, f_tenant, f_seq, want);
                b_ids := step.ids;
                b_since := step.since;
                b_last := step.last_seq;
                b_n := step.locked_count;
                IF cardinality(b_ids) > 0 THEN
                    locked := locked || b_ids;
                    locked_since := locked_since || b_since;
                END IF;
                -- coalesce: a step that locked nothing returns NULL ids (array_agg of no row), and
                -- a NULL count turned every later test of the cap false.
                set_aside := set_aside + b_n - coalesce(cardinality(b_ids), 0);
                EXIT WHEN cardinality(locked) >= _claim_walk.max_runs OR b_n < want;
                IF set_aside >= walk_cap THEN
                    PERFORM pg_notify('runrow_enqueued', '');
                    EXIT;
                END IF;
                f_seq := b_last + 1;
            END LOOP;
            RETURN;
        END IF;
    END IF;

    -- Delayed runs whose not_before has passed join agent_run_claimable. Only the due
    -- ones are read (a range of agent_run_delayed), a bounded number per claim (the next
    -- claim takes the rest), each locked SKIP LOCKED so concurrent claims split them.
    -- Looked for first: an UPDATE that changes nothing still fires agent_run's statement
    -- trigger, a function call and a statement more on every claim of a queue with no
    -- delayed run due (migration 0028). The look is the first entry of
    -- agent_run_delayed in its own order (enable_sort = off above keeps the planner there:
    -- a bare EXISTS with these filters can as well be planned through any index of queued
    -- runs, reading the whole queue).
    promoted := 0;
    IF (
        SELECT w.not_before FROM runrow.agent_run AS w
        WHERE w.status = 'queued' AND w.not_before IS NOT NULL
        ORDER BY w.not_before
        LIMIT 1
    ) <= now() THEN
        UPDATE runrow.agent_run AS d SET not_before = NULL, updated_at = now()
        WHERE d.id = ANY (ARRAY(
            SELECT w.id FROM runrow.agent_run AS w
            WHERE w.status = 'queued' AND w.not_before IS NOT NULL AND w.not_before <= now()
            ORDER BY w.not_before
            LIMIT 100
            FOR UPDATE SKIP LOCKED
        ));
        GET DIAGNOSTICS promoted = ROW_COUNT;
    END IF;

    -- Walk the queue one run at a time instead of one statement with the checks as
    -- filters: a filtered "ORDER BY ... LIMIT n" is planned from the estimated share of
    -- rows that pass the filters, so fresh statistics of a long queue made the planner
    -- sort the whole queue (and run the checks on every row), and stale ones of an empty
    -- queue turned the checks into anti joins over whole indexes. Each statement below
    -- has one sensible plan whatever the statistics: an ordered LIMIT 1 step of
    -- agent_run_claimable (priority DESC, tenant, concurrency key, enqueue_seq), probes
    -- by conversation, a point lock. The unique index, the turn-order trigger and the
    -- concurrency-limit trigger stay the guarantee; these steps only avoid their errors.
    --
    -- Order: the highest priority level first; within it, the tenant with the lowest
    -- virtual time (least recently served, weighted); within a tenant, arrival order
    -- across its concurrency keys. A level's tenants are found by a skip scan (one index
    -- descent per tenant), a tenant's keys likewise, each (tenant, key) range read from
    -- its head: what a claim reads grows with the active tenants and keys, not with how
    -- many runs wait behind each head.
    <<levels>>
    LOOP
        EXIT levels WHEN cardinality(locked) >= _claim_walk.max_runs;
        -- Every step returns the whole index entry it lands on: the first entry of a
        -- level is also its first tenant's first key's head, and so on, so the walk starts
        -- from the head of the index once per level (where the dead entries of runs
        -- claimed since the last vacuum lie) and every other step descends past them.
        IF h_lvl IS NULL THEN
            SELECT q.priority AS lvl, coalesce(q.fairness_key, '') AS fk, coalesce(q.concurrency_key, '') AS ck,
                   q.enqueue_seq AS seq, q.id, q.conversation_id AS conv INTO ent
            FROM runrow.agent_run AS q
            WHERE q.status = 'queued' AND NOT q.claim_blocked AND q.not_before IS NULL
            ORDER BY q.priority DESC, coalesce(q.fairness_key, ''), coalesce(q.concurrency_key, ''), q.enqueue_seq
            LIMIT 1;
        ELSE
            SELECT q.priority AS lvl, coalesce(q.fairness_key, '') AS fk, coalesce(q.concurrency_key, '') AS ck,
                   q.enqueue_seq AS seq, q.id, q.conversation_id AS conv INTO ent
            FROM runrow.agent_run AS q
            WHERE q.status = 'queued' AND NOT q.claim_blocked AND q.not_before IS NULL
              AND q.priority < h_lvl
            ORDER BY q.priority DESC, coalesce(q.fairness_key, ''), coalesce(q.concurrency_key, ''), q.enqueue_seq
            LIMIT 1;
        END IF;
        EXIT levels WHEN NOT FOUND;
        h_lvl := ent.lvl;
        -- Read once per claim, and only once the walk has found a run: an empty claim (in
        -- a fleet, every idle worker woken by an enqueue but the one that takes it) reads
        -- neither table.
        -- One statement for both: each statement PL/pgSQL runs costs an executor start-up.
        IF fleet_has_budgets IS NULL THEN
            SELECT ARRAY(
                       SELECT l.rate_limit_key FROM runrow.rate_limit AS l WHERE l.blocked_until > now()
                   ),
                   EXISTS (SELECT 1 FROM runrow.tenant_budget)
            INTO fleet_blocked_keys, fleet_has_budgets;
        END IF;

        -- The level's tenants, in index order (which is also the order their clocks are
        -- written in, so concurrent claims lock fairness_tenant rows in one order).
        t_key := '{}';
        t_head := '{}';
        t_ck := '{}';
        t_id := '{}';
        t_conv := '{}';
        LOOP
            t_key := t_key || ent.fk;
            t_head := t_head || ent.seq;
            t_ck := t_ck || ent.ck;
            t_id := t_id || ent.id;
            t_conv := t_conv || ent.conv;
            found_key := ent.fk;
            SELECT q.priority AS lvl, coalesce(q.fairness_key, '') AS fk, coalesce(q.concurrency_key, '') AS ck,
                   q.enqueue_seq AS seq, q.id, q.conversation_id AS conv INTO ent
            FROM runrow.agent_run AS q
            WHERE q.status = 'queued' AND NOT q.claim_blocked AND q.not_before IS NULL
              AND q.priority = h_lvl AND coalesce(q.fairness_key, '') > found_key
            ORDER BY q.priority DESC, coalesce(q.fairness_key, ''), coalesce(q.concurrency_key, ''), q.enqueue_seq
            LIMIT 1;
            EXIT WHEN NOT FOUND;
        END LOOP;

        IF cardinality(t_key) = 1 THEN
            -- One tenant: no choice to make, and no clock is written (below), so its clock
            -- and weight are not read (a statement fewer on the common single-tenant claim).
            t_vtime := '{0}';
            t_weight := '{1}';
            vfloor := -1;
        ELSE
            -- No banked credit: a tenant idle for a while (or new) starts where the latest
            -- run served here started (vfloor: the highest of each tenant's clock less its own
            -- last run, 1 / weight), not at its old clock: one run behind the most-served
            -- tenant, as start-time fair queueing starts an arrival at the virtual time of the
            -- job in service. Each tenant's own run, not the slowest tenant's: a floor one run
            -- of weight 0.001 behind let a newcomer take 500 claims in a row (issue 11's
            -- fairness audit), and one unit behind a tenant of weight 0.1 lifted the weight-1
            -- tenant beside it to within one run on every single-run claim, so the two shared
            -- 1 : 1 (the fleet-limits audit).
            SELECT array_agg(coalesce(f.vtime, 0) ORDER BY k.n), array_agg(coalesce(f.weight, 1) ORDER BY k.n),
                   max(coalesce(f.vtime, 0) - 1 / coalesce(f.weight, 1))
            INTO t_vtime, t_weight, vfloor
            FROM unnest(t_key) WITH ORDINALITY AS k (fairness_key, n)
            LEFT JOIN runrow.fairness_tenant AS f ON f.fairness_key = k.fairness_key;
        END IF;
        t_served := array_fill(0, ARRAY[cardinality(t_key)]);
        t_live := array_fill(true, ARRAY[cardinality(t_key)]);
        t_loaded := array_fill(false, ARRAY[cardinality(t_key)]);
        FOR i IN 1 .. cardinality(t_key) LOOP
            t_vtime[i] := greatest(t_vtime[i], vfloor);
        END LOOP;
        g_tenant := '{}';
        g_key := '{}';
        g_head_id := '{}';
        g_head_conv := '{}';
        g_head_seq := '{}';

        <<serve>>
        WHILE cardinality(locked) < _claim_walk.max_runs LOOP
            -- The live tenant with the lowest virtual time; among equals, the one whose
            -- head has waited longest, so equal tenants are served in arrival order.
            best := NULL;
            FOR i IN 1 .. cardinality(t_key) LOOP
                IF t_live[i] AND (best IS NULL OR t_vtime[i] < t_vtime[best]
                                  OR (t_vtime[i] = t_vtime[best] AND t_head[i] < t_head[best])) THEN
                    best := i;
                END IF;
            END LOOP;
            EXIT serve WHEN best IS NULL;
            h_tenant := t_key[best];

            IF NOT t_loaded[best] THEN
                -- The tenant's concurrency keys ('' = none), each with its head: the first
                -- from the tenant's own entry, the others by the same skip scan.
                g_tenant := g_tenant || best;
                g_key := g_key || t_ck[best];
                g_head_id := g_head_id || t_id[best];
                g_head_conv := g_head_conv || t_conv[best];
                g_head_seq := g_head_seq || t_head[best];
                found_key := t_ck[best];
                LOOP
                    SELECT q.priority AS lvl, coalesce(q.fairness_key, '') AS fk, coalesce(q.concurrency_key, '') AS ck,
                   q.enqueue_seq AS seq, q.id, q.conversation_id AS conv INTO ent
                    FROM runrow.agent_run AS q
                    WHERE q.status = 'queued' AND NOT q.claim_blocked AND q.not_before IS NULL
                      AND q.priority = h_lvl AND coalesce(q.fairness_key, '') = h_tenant
                      AND coalesce(q.concurrency_key, '') > found_key
                    ORDER BY q.priority DESC, coalesce(q.fairness_key, ''), coalesce(q.concurrency_key, ''),
                             q.enqueue_seq
                    LIMIT 1;
                    EXIT WHEN NOT FOUND;
                    g_tenant := g_tenant || best;
                    g_key := g_key || ent.ck;
                    g_head_id := g_head_id || ent.id;
                    g_head_conv := g_head_conv || ent.conv;
                    g_head_seq := g_head_seq || ent.seq;
                    found_key := ent.ck;
                END LOOP;
                t_loaded[best] := true;
            END IF;

            -- The tenant's oldest head over its live groups. A group's next head is
            -- fetched after each run taken from it (g_head_id NULL: fetch after g_head_seq;
            -- g_head_seq -1: the group is done this round).
            bg := NULL;
            FOR j IN 1 .. coalesce(cardinality(g_tenant), 0) LOOP
                CONTINUE WHEN g_tenant[j] <> best OR g_head_seq[j] < 0;
                IF g_key[j] <> '' AND g_key[j] = ANY (capped_keys) THEN
                    g_head_seq[j] := -1;
                    CONTINUE;
                END IF;
                IF g_head_id[j] IS NULL THEN
                    h_group := g_key[j];
                    h_after := g_head_seq[j];
                    SELECT q.id, q.conversation_id, q.enqueue_seq INTO cand
                    FROM runrow.agent_run AS q
                    WHERE q.status = 'queued' AND NOT q.claim_blocked AND q.not_before IS NULL
                      AND q.priority = h_lvl AND coalesce(q.fairness_key, '') = h_tenant
                      AND coalesce(q.concurrency_key, '') = h_group AND q.enqueue_seq > h_after
                    ORDER BY q.priority DESC, coalesce(q.fairness_key, ''), coalesce(q.concurrency_key, ''),
                             q.enqueue_seq
                    LIMIT 1;
                    IF NOT FOUND THEN
                        g_head_seq[j] := -1;
                        CONTINUE;
                    END IF;
                    g_head_id[j] := cand.id;
                    g_head_conv[j] := cand.conversation_id;
                    g_head_seq[j] := cand.enqueue_seq;
                END IF;
                IF bg IS NULL OR g_head_seq[j] < g_head_seq[bg] THEN
                    bg := j;
                END IF;
            END LOOP;
            IF bg IS NULL THEN
                t_live[best] := false;
                CONTINUE serve;
            END IF;
            t_head[best] := g_head_seq[bg];
            -- Consume the head: whatever happens to it below, the group's next look starts
            -- after it.
            g_head_id[bg] := NULL;

            -- The batch step (functions/_claim_batch_step.sql): the level has one tenant whose
            -- only group has no concurrency key, and no fleet limit can bite (no blocked
            -- rate-limit key, no budget), so the group's next runs are locked in one statement.
            -- Only in READ COMMITTED: elsewhere a blocked turn must not even be locked.
            IF cardinality(t_key) = 1 AND cardinality(g_tenant) = 1 AND g_key[bg] = '' AND may_mark
               AND NOT fleet_has_budgets AND cardinality(fleet_blocked_keys) = 0 THEN
                want := least(_claim_walk.max_runs - cardinality(locked), walk_cap - set_aside);
                IF want < 1 THEN
                    t_live[best] := false;
                    capped := true;
                    CONTINUE serve;
                END IF;
                step := runrow._claim_batch_step(h_lvl, h_tenant, g_head_seq[bg], want);
                b_ids := step.ids;
                b_since := step.since;
                b_last := step.last_seq;
                b_n := step.locked_count;
                IF cardinality(b_ids) > 0 THEN
                    locked := locked || b_ids;
                    locked_since := locked_since || b_since;
                    locked_keys := locked_keys || array_fill(''::text, ARRAY[cardinality(b_ids)]);
                END IF;
                -- Fewer than asked for: the group's range is read to its end (SKIP LOCKED
                -- rows do not count against the LIMIT).
                IF b_n < want THEN
                    g_head_seq[bg] := -1;
                ELSE
                    g_head_seq[bg] := b_last;
                END IF;
                set_aside := set_aside + b_n - coalesce(cardinality(b_ids), 0);
                IF set_aside >= walk_cap THEN
                    t_live[best] := false;
                    capped := true;
                END IF;
                CONTINUE serve;
            END IF;

            -- ==== Per-candidate checks: whether this run may start now. ====
            -- Every rule that keeps a queued run from being claimed goes here, as a filter
            -- in front of the guarantee the schema holds (CONTINUE serve skips the run;
            -- g_head_seq[bg] := -1 skips the rest of its group this round).

            -- Invariant 1 pre-filter (the unique index is the guarantee): served by that
            -- unique index, agent_run_one_active_per_conversation. Turn order: only the
            -- oldest open turn of a conversation. A turn locked by another claimer is
            -- still queued until that claim commits, so its successor is never taken
            -- instead of it; one we locked ourselves is still queued too, so one call takes
            -- one turn per conversation. An earlier turn that is active is the first
            -- probe's, so the second looks for an earlier queued one: status = 'queued'
            -- alone implies agent_run_queued_by_conversation's predicate and not
            -- agent_run_claimable's, so the probe never walks the queue (migration 0036).
            blocked := EXISTS (
                SELECT 1 FROM runrow.agent_run AS a
                WHERE a.conversation_id = g_head_conv[bg]
                  AND a.status IN ('running', 'waiting')
            ) OR EXISTS (
                SELECT 1 FROM runrow.agent_run AS o
                WHERE o.conversation_id = g_head_conv[bg]
                  AND o.status = 'queued'
                  AND o.enqueue_seq < g_head_seq[bg]
            );
            IF blocked AND may_mark AND set_aside >= walk_cap THEN
                t_live[best] := false;
                capped := true;
                CONTINUE serve;
            END IF;
            CONTINUE serve WHEN blocked AND NOT may_mark;

            -- Fleet limits: a run whose rate-limit key is blocked waits out the block as a
            -- delayed run (not_before := the block's end: out of agent_run_claimable, so no
            -- later claim walks it, promoted when due); a run of a tenant over its daily
            -- budget is not started: it ends failed budget_exhausted here, journaled.
            -- acquire_model_call refuses both anyway; this keeps them from taking a slot.
            IF fleet_has_budgets AND NOT blocked AND NOT h_tenant = ANY (fleet_checked_tenants) THEN
                -- One budget row and a range of spend_hour's key, once per tenant per claim.
                fleet_checked_tenants := fleet_checked_tenants || h_tenant;
                fleet_verdict := runrow._tenant_verdict(h_tenant);
                IF fleet_verdict IS NOT NULL THEN
                    fleet_over_tenants := fleet_over_tenants || h_tenant;
                    fleet_over_verdicts := fleet_over_verdicts || fleet_verdict;
                END IF;
            END IF;
            IF set_aside >= walk_cap AND h_tenant = ANY (fleet_over_tenants) THEN
                t_live[best] := false;
                capped := true;
                CONTINUE serve;
            END IF;
            IF NOT blocked AND (cardinality(fleet_blocked_keys) > 0 OR h_tenant = ANY (fleet_over_tenants)) THEN
                SELECT q.id, q.rate_limit_key INTO fleet_cand
                FROM runrow.agent_run AS q
                WHERE q.conversation_id = g_head_conv[bg]
                  AND q.enqueue_seq = g_head_seq[bg]
                  AND q.status = 'queued'
                FOR UPDATE SKIP LOCKED;
                CONTINUE serve WHEN NOT FOUND;
                IF h_tenant = ANY (fleet_over_tenants) THEN
                    PERFORM runrow._fail_queued_for_budget(
                        fleet_cand.id, fleet_over_verdicts[array_position(fleet_over_tenants, h_tenant)]
                    );
                    set_aside := set_aside + 1;
                    CONTINUE serve;
                END IF;
                IF fleet_cand.rate_limit_key = ANY (fleet_blocked_keys) THEN
                    IF set_aside >= walk_cap THEN
                        t_live[best] := false;
                        capped := true;
                        CONTINUE serve;
                    END IF;
                    -- The block's end, read again under a share lock, SKIP LOCKED. Read plainly,
                    -- a lift not yet committed (a limit removed, a key error's probe answered:
                    -- _lift_held_runs) went unseen, and the lift's statement, its snapshot older
                    -- than this claim's commit, did not see the hold: the run waited the whole
                    -- block (up to 300 s) with the key working (test_fleet_limits_races). Waited
                    -- for, the lock stalled every claim behind any writer of the key (an
                    -- operator's open transaction, a worker's commit) while it held its runs
                    -- (the review). So: a key row another transaction writes leaves the run due
                    -- and unheld (a lift may be under way; a later claim decides); a block
                    -- gone or over (lifted since the claim began) lets the run be claimed here.
                    SELECT l.blocked_until INTO fleet_held_to FROM runrow.rate_limit AS l
                    WHERE l.rate_limit_key = fleet_cand.rate_limit_key
                    FOR SHARE SKIP LOCKED;
                    IF NOT FOUND AND EXISTS (
                        SELECT 1 FROM runrow.rate_limit AS l WHERE l.rate_limit_key = fleet_cand.rate_limit_key
                    ) THEN
                        set_aside := set_aside + 1;
                        CONTINUE serve;
                    END IF;
                    IF fleet_held_to > now() THEN
                        set_aside := set_aside + 1;
                        UPDATE runrow.agent_run AS q SET not_before = fleet_held_to, updated_at = now()
                        WHERE q.id = fleet_cand.id;
                        CONTINUE serve;
                    END IF;
                END IF;
            END IF;

            -- Concurrency cap (agent_run_concurrency_limit is the guarantee). The limit
            -- row's lock makes the count stable until we commit; a limit row another
            -- claimer holds means "try the key next round", not "wait". A capped key is
            -- skipped as a whole, in every tenant, for the rest of this claim.
            IF NOT blocked AND g_key[bg] <> '' AND NOT g_key[bg] = ANY (held_keys) THEN
                h_group := g_key[bg];
                SELECT l.max_running INTO cap FROM runrow.concurrency_limit AS l
                WHERE l.concurrency_key = h_group;
                IF FOUND THEN
                    SELECT l.max_running INTO cap FROM runrow.concurrency_limit AS l
                    WHERE l.concurrency_key = h_group
                    FOR UPDATE SKIP LOCKED;
                    IF NOT FOUND THEN
                        capped_keys := capped_keys || h_group;
                        g_head_seq[bg] := -1;
                        CONTINUE serve;
                    END IF;
                    held_keys := held_keys || h_group;
                END IF;
            END IF;
            IF NOT blocked AND g_key[bg] = ANY (held_keys) THEN
                h_group := g_key[bg];
                SELECT l.max_running INTO cap FROM runrow.concurrency_limit AS l
                WHERE l.concurrency_key = h_group;
                SELECT count(*) INTO open_runs FROM (
                    SELECT 1 FROM runrow.agent_run AS a
                    WHERE a.concurrency_key = h_group AND a.status IN ('running', 'waiting')
                    LIMIT cap
                ) AS o;
                open_runs := open_runs + (
                    SELECT count(*) FROM unnest(locked_keys) AS lk (k) WHERE lk.k = h_group
                );
                IF open_runs >= cap THEN
                    capped_keys := capped_keys || h_group;
                    g_head_seq[bg] := -1;
                    CONTINUE serve;
                END IF;
            END IF;
            -- ==== End of the per-candidate checks. ====

            -- The lock: one row, skipped if another claimer (or the trigger that unblocks
            -- a turn) holds it, re-checked (still queued) once locked. Every index whose
            -- predicate this WHERE implies has a column of it as key (not so for id:
            -- agent_run_claimable would qualify with no key to descend), so any plan is a
            -- point lookup.
            SELECT q.id, q.updated_at INTO got, got_since
            FROM runrow.agent_run AS q
            WHERE q.conversation_id = g_head_conv[bg]
              AND q.enqueue_seq = g_head_seq[bg]
              AND q.status = 'queued'
            FOR UPDATE SKIP LOCKED;
            CONTINUE serve WHEN NOT FOUND;
            IF blocked THEN
                -- Mark it so no later claim reads it again, but only if it is still blocked
                -- now that we hold its lock: these probes take a fresh snapshot, so a turn
                -- ahead that ended before we locked is seen ended, and one that ends after
                -- waits for our lock in agent_run_after_update and clears the mark.
                -- A turn found free after all is left for the next claim.
                blocked := EXISTS (
                    SELECT 1 FROM runrow.agent_run AS a
                    WHERE a.conversation_id = g_head_conv[bg]
                      AND a.status IN ('running', 'waiting')
                ) OR EXISTS (
                    SELECT 1 FROM runrow.agent_run AS o
                    WHERE o.conversation_id = g_head_conv[bg]
                      AND o.status = 'queued'
                      AND o.enqueue_seq < g_head_seq[bg]
                );
                IF blocked THEN
                    UPDATE runrow.agent_run AS q SET claim_blocked = true, updated_at = now() WHERE q.id = got;
                    set_aside := set_aside + 1;
                END IF;
                CONTINUE serve;
            END IF;
            locked := locked || got;
            locked_since := locked_since || got_since;
            locked_keys := locked_keys || g_key[bg];
            t_served[best] := t_served[best] + 1;
            t_vtime[best] := t_vtime[best] + 1 / t_weight[best];
        END LOOP;

        -- The tenants' clocks, only when there was a choice between tenants: a lone
        -- tenant's clock needs no advancing (the floor above catches it up when another
        -- arrives), so a single-tenant queue writes no fairness row. Written as
        -- increments on the row as it is now, in index order (one lock order for all
        -- claimers), so concurrent claims of the same tenant add up instead of overwriting.
        IF cardinality(t_key) > 1 THEN
            FOR i IN 1 .. cardinality(t_key) LOOP
                CONTINUE WHEN t_served[i] = 0;
                h_tenant := t_key[i];
                INSERT INTO runrow.fairness_tenant AS f (fairness_key, vtime)
                VALUES (h_tenant, greatest(0, vfloor) + t_served[i])
                ON CONFLICT (fairness_key) DO UPDATE
                SET vtime = greatest(f.vtime, vfloor) + t_served[i] / f.weight, updated_at = now();
            END LOOP;
        END IF;
        EXIT levels WHEN capped;
    END LOOP;
    IF capped THEN
        -- Empty: no conversation in particular; the dispatchers claim again on any wake.
        PERFORM pg_notify('runrow_enqueued', '');
    END IF;
END
$fn$;

REVOKE ALL ON FUNCTION runrow._claim_walk(text, integer, integer) FROM PUBLIC;
