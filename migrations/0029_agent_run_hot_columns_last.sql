-- depends: 0028_after_update_per_statement
-- agent_run's columns that the claim, the heartbeat and the finish change, moved together to
-- the end of the row (issue 11: WAL per lifecycle).
--
-- Why: neither the claim nor the finish can be a HOT update (status is in the predicate of
-- most of agent_run's indexes), but when the new row version lands on the same page,
-- PostgreSQL logs only the bytes between the longest common prefix and the longest common
-- suffix of the old and new versions (log_heap_update). With the changing columns spread from
-- the 6th to the 25th, that was nearly the whole row: 280-290 bytes per update, twice per run.
-- Together at the end, it is the changed columns alone. The order puts the claim-only
-- columns first and the finish-only ones last, so each update's changed span is short:
--
--   attempt, started_at, worker_id          set by the claim
--   status, claim_token, claim_expires_at,  changed by the claim and the finish
--   last_heartbeat_at, updated_at           (the heartbeat: claim_expires_at .. updated_at)
--   finished_at, result, error              set by the finish
--
-- How: PostgreSQL cannot reorder columns, so each one is renamed out of the way, re-added
-- under its own name at the end, and copied over in one table rewrite (ALTER ... TYPE ...
-- USING the old column); then the old columns are dropped and CLUSTER rewrites the table once
-- more without their bytes (a dropped column's data stays in every row until it is rewritten).
-- Views bind to columns, not names: each view that reads agent_run is re-created from its own
-- definition, read back before the rename, so it reads the new columns; CREATE OR REPLACE
-- keeps its grants, comment and the views built on it. The constraints, indexes and triggers
-- that read the moved columns are re-created below exactly as they were.
--
-- Cost of upgrading: two rewrites of agent_run and its indexes under an ACCESS EXCLUSIVE
-- lock (about 2 s per 100,000 runs on a 2-core box); run it in a maintenance window.
--
-- Measured (tests/test_agent_run_layout.py; WAL of one session's claim_runs(10) +
-- finish_runs, pg_waldump): see the commit message.

-- The views' definitions, read while they still name the columns they mean.
CREATE TEMPORARY TABLE agent_run_views ON COMMIT DROP AS
SELECT
    c.oid::regclass AS view_name,
    pg_get_viewdef(c.oid) AS definition
FROM pg_class AS c
WHERE
    c.relkind = 'v'
    AND c.oid IN (
        SELECT r.ev_class
        FROM pg_depend AS d
        INNER JOIN pg_rewrite AS r ON d.objid = r.oid
        WHERE d.classid = 'pg_rewrite'::regclass AND d.refobjid = 'runrow.agent_run'::regclass
    );

-- The triggers that read a moved column (in WHEN or UPDATE OF): re-created below.
DROP TRIGGER agent_run_guard ON runrow.agent_run;
DROP TRIGGER agent_run_concurrency_limit ON runrow.agent_run;
DROP TRIGGER agent_run_webhook_outbox ON runrow.agent_run;

ALTER TABLE runrow.agent_run RENAME COLUMN attempt TO attempt_before_0029;
ALTER TABLE runrow.agent_run RENAME COLUMN started_at TO started_at_before_0029;
ALTER TABLE runrow.agent_run RENAME COLUMN worker_id TO worker_id_before_0029;
ALTER TABLE runrow.agent_run RENAME COLUMN status TO status_before_0029;
ALTER TABLE runrow.agent_run RENAME COLUMN claim_token TO claim_token_before_0029;
ALTER TABLE runrow.agent_run RENAME COLUMN claim_expires_at TO claim_expires_at_before_0029;
ALTER TABLE runrow.agent_run RENAME COLUMN last_heartbeat_at TO last_heartbeat_at_before_0029;
ALTER TABLE runrow.agent_run RENAME COLUMN updated_at TO updated_at_before_0029;
ALTER TABLE runrow.agent_run RENAME COLUMN finished_at TO finished_at_before_0029;
ALTER TABLE runrow.agent_run RENAME COLUMN result TO result_before_0029;
ALTER TABLE runrow.agent_run RENAME COLUMN error TO error_before_0029;

ALTER TABLE runrow.agent_run
ADD COLUMN attempt integer NOT NULL DEFAULT 0,
ADD COLUMN started_at timestamptz,
ADD COLUMN worker_id text,
ADD COLUMN status text NOT NULL DEFAULT 'queued',
ADD COLUMN claim_token uuid,
ADD COLUMN claim_expires_at timestamptz,
ADD COLUMN last_heartbeat_at timestamptz,
ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now(),
ADD COLUMN finished_at timestamptz,
ADD COLUMN result jsonb,
ADD COLUMN error text;

-- One rewrite copies every row's values into the new columns.
ALTER TABLE runrow.agent_run
ALTER COLUMN attempt TYPE integer USING attempt_before_0029,
ALTER COLUMN started_at TYPE timestamptz USING started_at_before_0029,
ALTER COLUMN worker_id TYPE text USING worker_id_before_0029,
ALTER COLUMN status TYPE text USING status_before_0029,
ALTER COLUMN claim_token TYPE uuid USING claim_token_before_0029,
ALTER COLUMN claim_expires_at TYPE timestamptz USING claim_expires_at_before_0029,
ALTER COLUMN last_heartbeat_at TYPE timestamptz USING last_heartbeat_at_before_0029,
ALTER COLUMN updated_at TYPE timestamptz USING updated_at_before_0029,
ALTER COLUMN finished_at TYPE timestamptz USING finished_at_before_0029,
ALTER COLUMN result TYPE jsonb USING result_before_0029,
ALTER COLUMN error TYPE text USING error_before_0029;

-- The views, re-bound to the new columns by name.
DO $do$
DECLARE
    v record;
BEGIN
    FOR v IN SELECT * FROM agent_run_views LOOP
        EXECUTE format('CREATE OR REPLACE VIEW %s AS %s', v.view_name, v.definition);
    END LOOP;
END
$do$;

-- Dropping the old columns drops the indexes and CHECK constraints that read them.
ALTER TABLE runrow.agent_run
DROP COLUMN attempt_before_0029,
DROP COLUMN started_at_before_0029,
DROP COLUMN worker_id_before_0029,
DROP COLUMN status_before_0029,
DROP COLUMN claim_token_before_0029,
DROP COLUMN claim_expires_at_before_0029,
DROP COLUMN last_heartbeat_at_before_0029,
DROP COLUMN updated_at_before_0029,
DROP COLUMN finished_at_before_0029,
DROP COLUMN result_before_0029,
DROP COLUMN error_before_0029;

-- The invariants over the moved columns, as they were (0001, 0012, 0013, 0018).
ALTER TABLE runrow.agent_run
ADD CONSTRAINT agent_run_status_check CHECK (
    status IN ('queued', 'running', 'waiting', 'completed', 'failed', 'cancelled', 'dead')
),
ADD CONSTRAINT agent_run_attempt_range CHECK (attempt >= 0 AND attempt <= max_attempts),
ADD CONSTRAINT agent_run_running_has_attempt CHECK (status <> 'running' OR attempt >= 1),
ADD CONSTRAINT agent_run_claim_iff_running CHECK (
    (status = 'running') = (claim_token IS NOT NULL AND worker_id IS NOT NULL AND claim_expires_at IS NOT NULL)
),
ADD CONSTRAINT agent_run_no_claim_unless_running CHECK (
    status = 'running' OR (claim_token IS NULL AND claim_expires_at IS NULL)
),
ADD CONSTRAINT agent_run_finished_iff_terminal CHECK (
    (status IN ('completed', 'failed', 'cancelled', 'dead')) = (finished_at IS NOT NULL)
);

CREATE UNIQUE INDEX agent_run_one_active_per_conversation ON runrow.agent_run (conversation_id)
WHERE status IN ('running', 'waiting');
CREATE INDEX agent_run_open_by_conversation ON runrow.agent_run (conversation_id, enqueue_seq)
WHERE status IN ('queued', 'running', 'waiting');
CREATE INDEX agent_run_claimable ON runrow.agent_run (
    priority DESC, coalesce(fairness_key, ''), coalesce(concurrency_key, ''), enqueue_seq
)
WHERE status = 'queued' AND NOT claim_blocked AND not_before IS NULL;
CREATE INDEX agent_run_delayed ON runrow.agent_run (not_before)
WHERE status = 'queued' AND not_before IS NOT NULL;
CREATE INDEX agent_run_open_by_concurrency_key ON runrow.agent_run (concurrency_key)
WHERE status IN ('running', 'waiting') AND concurrency_key IS NOT NULL;
CREATE INDEX agent_run_running ON runrow.agent_run (worker_id)
WHERE status = 'running';
CREATE INDEX agent_run_finished_idx ON runrow.agent_run (finished_at)
WHERE finished_at IS NOT NULL;
CREATE INDEX agent_run_untrimmed ON runrow.agent_run (finished_at)
WHERE finished_at IS NOT NULL AND request_snapshot IS NOT NULL;
CREATE INDEX agent_run_terminal_anomaly ON runrow.agent_run (id)
WHERE status IN ('completed', 'failed', 'cancelled', 'dead') AND (claim_token IS NOT NULL OR finished_at IS NULL);

CREATE TRIGGER agent_run_guard
BEFORE UPDATE ON runrow.agent_run
FOR EACH ROW
WHEN (
    old.status IN ('completed', 'failed', 'cancelled', 'dead')
    OR new.updated_at <> now()
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

CREATE TRIGGER agent_run_concurrency_limit
BEFORE UPDATE OF status ON runrow.agent_run
FOR EACH ROW
WHEN (old.status = 'queued' AND new.status = 'running' AND new.concurrency_key IS NOT NULL)
EXECUTE FUNCTION runrow._enforce_concurrency_limit();

CREATE TRIGGER agent_run_webhook_outbox
AFTER UPDATE OF status ON runrow.agent_run
FOR EACH ROW
WHEN (
    new.webhook_url IS NOT NULL
    AND old.status IN ('queued', 'running', 'waiting')
    AND new.status IN ('completed', 'failed', 'cancelled', 'dead')
)
EXECUTE FUNCTION runrow._webhook_outbox();

-- The second rewrite: every row without the dropped columns' bytes, in run id (UUIDv7, so
-- creation) order, its pages filled to the table's fillfactor. Only when there are rows:
-- CLUSTER records the table's size in pg_class (reltuples 0 for an empty one), and an empty
-- table known to be empty loses the planner's guess for a table never vacuumed (at least 10
-- pages). A fresh install's sessions then cache generic plans that scan the whole table for a
-- lookup by key, and keep them while the table grows, until its first ANALYZE: a bulk enqueue
-- in one transaction cost O(n) per run (2,000 runs read 6 million rows), a worker that
-- started on the empty table scanned it on every heartbeat and finish
-- (tests/test_fresh_install_plans.py).
DO $$
BEGIN
    IF EXISTS (SELECT FROM runrow.agent_run) THEN
        CLUSTER runrow.agent_run USING agent_run_pkey;
    END IF;
END
$$;
ALTER TABLE runrow.agent_run SET WITHOUT CLUSTER;
