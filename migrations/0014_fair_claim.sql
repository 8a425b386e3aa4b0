-- The claim's order (SPEC.md "Fleet scheduling"): priority (high first), then fairly across
-- fairness keys (tenants), then arrival; delayed runs and runs whose concurrency key is at its
-- limit are not claimed. Every rule keeps the claim's cost tied to what it claims, not to the
-- queue behind it (migration 0012's property):
--
-- - agent_run_claimable is keyed (priority DESC, tenant, concurrency key, enqueue_seq), so the
--   top priority level is the first entry, the tenants of a level are enumerated by a skip scan
--   (one descent each: cost grows with active tenants, never with their queue depth), and the
--   runs of one tenant under one concurrency key form a contiguous range, so a capped key is
--   skipped as a whole instead of run by run. NULL tenant and NULL key are stored as '' (no
--   real key is empty: the columns' checks), so the skip scan sees them as ordinary values.
-- - A delayed run (not_before set) stays out of agent_run_claimable, so no claim walks the
--   runs of the future; the claim promotes the few that are due (not_before := NULL) through
--   agent_run_delayed, a range scan that reads only what is due.
-- - Fairness is least-recently-served by a virtual clock per tenant (fairness_tenant.vtime,
--   advanced by 1/weight per run claimed). Written only when a claim chose among two or more
--   tenants, so a single-tenant queue (the common case, and every throughput benchmark) pays
--   no write and no lock for it.
-- - A concurrency limit is guaranteed by agent_run_concurrency_limit: a run of a limited key
--   starts only under the limit row's lock (an UPDATE, so a concurrent REPEATABLE READ claimer
--   fails to serialize instead of counting from a stale snapshot) after counting the key's
--   running and waiting runs. The claim takes the same lock first (SKIP LOCKED) and counts, so
--   the trigger never fires an error at a claim; it only stops any other way in.
-- depends: 0013_fleet_run_columns

CREATE TABLE runrow.concurrency_limit (
    concurrency_key text PRIMARY KEY CHECK (length(concurrency_key) BETWEEN 1 AND 200),
    max_running integer NOT NULL CHECK (max_running BETWEEN 0 AND 100000),
    -- Written by every claim of the key: the write is the lock's REPEATABLE READ guard.
    last_claimed_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE runrow.concurrency_limit IS
'At most max_running runs of concurrency_key running or waiting at once (set_concurrency_limit). '
'A key with no row has no cap. Enforced by the agent_run_concurrency_limit trigger.';

CREATE TABLE runrow.fairness_tenant (
    -- '' is the anonymous tenant (runs with no fairness_key and no user).
    fairness_key text PRIMARY KEY CHECK (length(fairness_key) <= 200),
    weight double precision NOT NULL DEFAULT 1 CHECK (weight > 0 AND weight <= 1000),
    -- Virtual time of service: advanced by 1/weight per run claimed; the claim serves the
    -- active tenant with the lowest, never letting one fall more than one run behind the
    -- most-served active tenant (no credit banked while idle).
    vtime double precision NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE runrow.fairness_tenant IS
'Per tenant (fairness key; '''' = anonymous): its claim weight (set_fairness_weight) and its '
'virtual clock of service (written by the claim). A tenant with no row has weight 1.';

DROP INDEX runrow.agent_run_claimable;
CREATE INDEX agent_run_claimable ON runrow.agent_run (
    priority DESC, coalesce(fairness_key, ''), coalesce(concurrency_key, ''), enqueue_seq
)
WHERE status = 'queued' AND NOT claim_blocked AND not_before IS NULL;

-- Queued runs not claimable before not_before: the claim promotes the due ones from its head.
CREATE INDEX agent_run_delayed ON runrow.agent_run (not_before)
WHERE status = 'queued' AND not_before IS NOT NULL;

-- The cap's count: the running and waiting runs of one key (a set bounded by the limit).
CREATE INDEX agent_run_open_by_concurrency_key ON runrow.agent_run (concurrency_key)
WHERE status IN ('running', 'waiting') AND concurrency_key IS NOT NULL;

CREATE FUNCTION runrow._enforce_concurrency_limit() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    cap integer;
    open_runs integer;
BEGIN
    UPDATE runrow.concurrency_limit AS l SET last_claimed_at = now()
    WHERE l.concurrency_key = NEW.concurrency_key
    RETURNING l.max_running INTO cap;
    IF NOT FOUND THEN
        RETURN NEW;
    END IF;
    -- Sees the runs this same statement already moved to running (a BEFORE row trigger sees
    -- the rows processed before it), so a batch claim cannot overshoot either.
    SELECT count(*) INTO open_runs FROM (
        SELECT 1 FROM runrow.agent_run AS a
        WHERE a.concurrency_key = NEW.concurrency_key AND a.status IN ('running', 'waiting')
        LIMIT cap
    ) AS o;
    IF open_runs >= cap THEN
        RAISE EXCEPTION 'run %: concurrency key "%" is at its limit of % running or waiting runs',
            NEW.id, NEW.concurrency_key, cap
            USING ERRCODE = 'check_violation', CONSTRAINT = 'agent_run_concurrency_limit';
    END IF;
    RETURN NEW;
END
$fn$;

REVOKE ALL ON FUNCTION runrow._enforce_concurrency_limit() FROM PUBLIC;

CREATE TRIGGER agent_run_concurrency_limit
BEFORE UPDATE OF status ON runrow.agent_run
FOR EACH ROW
WHEN (old.status = 'queued' AND new.status = 'running' AND new.concurrency_key IS NOT NULL)
EXECUTE FUNCTION runrow._enforce_concurrency_limit();

-- DBA views. They read the queue (not the history), so they cost what the queue holds.
CREATE VIEW runrow.queue_by_tenant AS
SELECT
    a.priority,
    a.fairness_key,
    count(*) FILTER (WHERE a.not_before IS NULL) AS queued,
    count(*) FILTER (WHERE a.not_before IS NOT NULL) AS delayed,
    now() - min(a.updated_at) FILTER (WHERE a.not_before IS NULL) AS oldest_wait,
    min(a.not_before) AS next_due
FROM runrow.agent_run AS a
WHERE a.status = 'queued'
GROUP BY a.priority, a.fairness_key;

COMMENT ON VIEW runrow.queue_by_tenant IS
'Queued runs per priority level and tenant (fairness_key; NULL = anonymous): queued = claimable '
'or waiting behind a turn of their conversation; delayed = not claimable before their not_before '
'(start_in, retry_in); oldest_wait = how long the longest-waiting of the queued ones has been in '
'the queue; next_due = the earliest not_before. Claims take priorities high first and tenants '
'fairly within a priority.';

CREATE VIEW runrow.delayed_runs AS
SELECT
    a.id AS run_id,
    a.conversation_id,
    a.fairness_key,
    a.priority,
    a.not_before,
    a.not_before - now() AS due_in,
    a.attempt,
    a.max_attempts
FROM runrow.agent_run AS a
WHERE a.status = 'queued' AND a.not_before IS NOT NULL;

COMMENT ON VIEW runrow.delayed_runs IS
'Queued runs waiting on not_before (enqueue_run start_in, release_run retry_in); due_in is '
'negative for a due run no claim has promoted yet (promoted by the next claim).';

CREATE VIEW runrow.concurrency_limits AS
SELECT
    l.concurrency_key,
    l.max_running,
    (
        SELECT count(*) FROM runrow.agent_run AS a
        WHERE a.concurrency_key = l.concurrency_key AND a.status IN ('running', 'waiting')
    ) AS running_or_waiting,
    (
        SELECT count(*) FROM runrow.agent_run AS a
        WHERE a.concurrency_key = l.concurrency_key AND a.status = 'queued'
    ) AS queued,
    l.last_claimed_at,
    l.updated_at
FROM runrow.concurrency_limit AS l;

COMMENT ON VIEW runrow.concurrency_limits IS
'Each concurrency limit with its running-or-waiting runs (never more than max_running once '
'claims started under the limit) and its queued runs.';

GRANT SELECT ON runrow.concurrency_limit, runrow.fairness_tenant TO runrow_auditor;
GRANT SELECT ON runrow.queue_by_tenant, runrow.delayed_runs, runrow.concurrency_limits TO runrow_auditor;
