-- runrow core schema: the run lifecycle, the live journal, the prompt registry and roles.
-- Every invariant of SPEC.md that can live in the schema lives here; functions/ only
-- adds the API on top. Objects are fully qualified so search_path never matters.

CREATE SCHEMA IF NOT EXISTS runrow;

-- Roles are cluster-wide: create them only when missing so a second database in the
-- same cluster (or a re-install) does not fail. The check cannot see a role another
-- session created and has not committed yet (two databases migrated at once), so that
-- CREATE waits for it and then raises unique_violation: the role exists, which is all
-- this needs. NOLOGIN: grant them to login roles.
DO $roles$
DECLARE
    role_name text;
BEGIN
    FOREACH role_name IN ARRAY ARRAY['runrow_worker', 'runrow_client', 'runrow_auditor'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = role_name) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', role_name);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;
            END;
        END IF;
    END LOOP;
END
$roles$;

REVOKE ALL ON SCHEMA runrow FROM PUBLIC;
GRANT USAGE ON SCHEMA runrow TO runrow_worker, runrow_client, runrow_auditor;
-- Functions created later in this schema by the installing role are not executable by
-- PUBLIC; each file in functions/ grants EXECUTE to exactly the roles that need it.
ALTER DEFAULT PRIVILEGES IN SCHEMA runrow REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- The prompt registry: content-addressed and immutable. `id` is the hex SHA-256 of
-- the canonical text of {"system": ..., "tools": ...} (see runrow._prompt_id).
CREATE TABLE runrow.prompt (
    id text PRIMARY KEY CHECK (id ~ '^[0-9a-f]{64}$'),
    system_prompt text,
    tools jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(tools) = 'array'),
    created_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE runrow.prompt IS
'Prompt registry: system prompt + tool definitions, addressed by the SHA-256 of their '
'content. Rows are immutable (trigger) and cannot be deleted while a run references '
'them (foreign key), so a run in flight always resolves the exact prompt it was pinned to.';

-- The user messages of each turn. A stopped turn's message becomes a draft.
CREATE TABLE runrow.message (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    conversation_id uuid NOT NULL,
    user_id text,
    role text NOT NULL DEFAULT 'user' CHECK (role = 'user'),
    content jsonb NOT NULL CHECK (
        (jsonb_typeof(content) = 'string' AND content #>> '{}' <> '')
        OR (jsonb_typeof(content) = 'array' AND jsonb_array_length(content) > 0)
    ),
    status text NOT NULL DEFAULT 'submitted' CHECK (status IN ('submitted', 'draft')),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX message_conversation_idx ON runrow.message (conversation_id, created_at);

COMMENT ON TABLE runrow.message IS
'The user message of each turn, the durable transcript of what the user said. '
'status = draft: the turn was stopped before it started and the text is handed back.';

CREATE TABLE runrow.agent_run (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    -- Enqueue order. A sequence, not a timestamp: two turns enqueued in one
    -- transaction share now() but never an enqueue_seq.
    enqueue_seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    conversation_id uuid NOT NULL,
    user_id text,
    user_message_id uuid NOT NULL REFERENCES runrow.message (id),
    status text NOT NULL DEFAULT 'queued' CHECK (
        status IN ('queued', 'running', 'waiting', 'completed', 'failed', 'cancelled', 'dead')
    ),
    attempt integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL DEFAULT 1 CHECK (max_attempts BETWEEN 1 AND 100),
    model text NOT NULL CHECK (model <> ''),
    prompt_id text NOT NULL REFERENCES runrow.prompt (id) ON DELETE RESTRICT,
    claim_token uuid,
    claim_expires_at timestamptz,
    last_heartbeat_at timestamptz,
    worker_id text,
    cancel_requested boolean NOT NULL DEFAULT false,
    idempotency_key text CHECK (idempotency_key <> ''),
    metadata jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    -- The request snapshot (may hold PII); trim_journal nulls it with the journal.
    request_snapshot jsonb,
    retry_of uuid REFERENCES runrow.agent_run (id),
    result jsonb,
    error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- Invariant 3: a running run has a claim token, a worker and a lease; any other
    -- status holds no claim at all, so a stale token can never match a non-running run.
    CONSTRAINT agent_run_claim_iff_running CHECK (
        (status = 'running')
        = (claim_token IS NOT NULL AND worker_id IS NOT NULL AND claim_expires_at IS NOT NULL)
    ),
    CONSTRAINT agent_run_no_claim_unless_running CHECK (
        status = 'running' OR (claim_token IS NULL AND claim_expires_at IS NULL)
    ),
    CONSTRAINT agent_run_attempt_range CHECK (attempt BETWEEN 0 AND max_attempts),
    CONSTRAINT agent_run_running_has_attempt CHECK (status <> 'running' OR attempt >= 1),
    CONSTRAINT agent_run_finished_iff_terminal CHECK (
        (status IN ('completed', 'failed', 'cancelled', 'dead')) = (finished_at IS NOT NULL)
    )
)
-- Room on each page so heartbeats (which touch no indexed column) stay HOT updates.
WITH (fillfactor = 80);

COMMENT ON TABLE runrow.agent_run IS
'One row per run (one turn of a conversation). Written only by runrow.* functions. '
'Terminal states (completed, failed, cancelled, dead) are sticky (trigger).';

-- Invariant 1: at most one active (running or waiting) run per conversation.
CREATE UNIQUE INDEX agent_run_one_active_per_conversation
ON runrow.agent_run (conversation_id)
WHERE status IN ('running', 'waiting');

-- Invariant 5: an idempotency key maps to at most one run.
CREATE UNIQUE INDEX agent_run_idempotency_key
ON runrow.agent_run (idempotency_key)
WHERE idempotency_key IS NOT NULL;

-- The claim's index: only queued rows, in claim order, so its cost does not grow with
-- the number of finished runs. Matches the claim's WHERE status = 'queued' ORDER BY
-- enqueue_seq.
CREATE INDEX agent_run_claimable ON runrow.agent_run (enqueue_seq)
WHERE status = 'queued';

-- "Is there an earlier queued turn of this conversation?" for the claim's turn order.
CREATE INDEX agent_run_queued_by_conversation
ON runrow.agent_run (conversation_id, enqueue_seq)
WHERE status = 'queued';

-- The reaper's index: the running runs (a set bounded by worker capacity, not by
-- history). Deliberately not on claim_expires_at: a heartbeat writes that column, and
-- an index on it would turn every heartbeat into a non-HOT update.
CREATE INDEX agent_run_running ON runrow.agent_run (worker_id)
WHERE status = 'running';

CREATE INDEX agent_run_conversation_idx ON runrow.agent_run (conversation_id, created_at);
CREATE INDEX agent_run_finished_idx ON runrow.agent_run (finished_at)
WHERE finished_at IS NOT NULL;

-- The live journal: a per-run, gap-free, append-only event log.
CREATE TABLE runrow.run_event (
    run_id uuid NOT NULL REFERENCES runrow.agent_run (id),
    seq bigint NOT NULL CHECK (seq >= 1),
    type text NOT NULL CHECK (type <> ''),
    payload jsonb NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);

COMMENT ON TABLE runrow.run_event IS
'The live journal of each run, keyed (run_id, seq); seq starts at 1 and has no gaps '
'(trigger). Rows are never updated; they are deleted only by trim_journal, whole, '
'once the run is terminal. payload is the event object as written, including its type.';

-- ---------------------------------------------------------------------------------
-- Triggers: the invariants a WHERE clause cannot be trusted to keep.
-- ---------------------------------------------------------------------------------

CREATE FUNCTION runrow._agent_run_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
BEGIN
    -- Invariant 2: terminal states are sticky. Nothing, not even the table owner,
    -- moves a row out of completed/failed/cancelled/dead or edits it. The one change
    -- allowed is trim_journal dropping the PII snapshot.
    IF OLD.status IN ('completed', 'failed', 'cancelled', 'dead') THEN
        IF NEW.request_snapshot IS NULL
           AND (to_jsonb(NEW) - 'request_snapshot' - 'updated_at')
               = (to_jsonb(OLD) - 'request_snapshot' - 'updated_at') THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'run % is % and terminal states are sticky', OLD.id, OLD.status
            USING ERRCODE = 'integrity_constraint_violation',
                  HINT = 'A terminal run can be run again only as a new run: runrow.retry_run().';
    END IF;
    -- Identity of a run never changes.
    IF NEW.id <> OLD.id
       OR NEW.conversation_id <> OLD.conversation_id
       OR NEW.user_message_id <> OLD.user_message_id
       OR NEW.prompt_id <> OLD.prompt_id
       OR NEW.model <> OLD.model
       OR NEW.created_at <> OLD.created_at
       OR NEW.enqueue_seq <> OLD.enqueue_seq THEN
        RAISE EXCEPTION 'run %: id, conversation, message, model, prompt and created_at are immutable', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    -- Status moves only along the lifecycle of SPEC.md.
    IF NEW.status <> OLD.status AND NOT (
        (OLD.status = 'queued' AND NEW.status IN ('running', 'cancelled'))
        OR (OLD.status = 'running' AND NEW.status IN ('queued', 'waiting', 'completed', 'failed', 'cancelled', 'dead'))
        OR (OLD.status = 'waiting' AND NEW.status IN ('queued', 'cancelled'))
    ) THEN
        RAISE EXCEPTION 'run %: illegal status change % -> %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    -- Turn order: a turn starts only when no earlier turn of its conversation is still
    -- queued. The claim never picks such a turn; this makes it impossible.
    IF NEW.status = 'running' AND OLD.status = 'queued' AND EXISTS (
        SELECT 1 FROM runrow.agent_run AS earlier
        WHERE earlier.conversation_id = NEW.conversation_id
          AND earlier.status = 'queued'
          AND earlier.enqueue_seq < NEW.enqueue_seq
    ) THEN
        -- 40001: a concurrent enqueue committed an earlier turn after the claimer's
        -- snapshot; the claim treats it like any serialization failure and retries later.
        RAISE EXCEPTION 'run %: an earlier turn of conversation % is still queued', NEW.id, NEW.conversation_id
            USING ERRCODE = 'serialization_failure';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END
$fn$;

CREATE TRIGGER agent_run_guard
BEFORE UPDATE ON runrow.agent_run
FOR EACH ROW EXECUTE FUNCTION runrow._agent_run_guard();

CREATE FUNCTION runrow._agent_run_no_delete() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
BEGIN
    RAISE EXCEPTION 'runs are never deleted (run %)', OLD.id
        USING ERRCODE = 'integrity_constraint_violation',
              HINT = 'Use runrow.trim_journal() to drop old journals; runs and steps are the record.';
END
$fn$;

CREATE TRIGGER agent_run_no_delete
BEFORE DELETE ON runrow.agent_run
FOR EACH ROW EXECUTE FUNCTION runrow._agent_run_no_delete();

CREATE FUNCTION runrow._run_event_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    expected bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- Invariant 4: seq is the next one, no gap, no reuse. Rows inserted earlier by
        -- the same statement are visible here, so multi-row appends work.
        SELECT coalesce(max(e.seq), 0) + 1 INTO expected
        FROM runrow.run_event AS e WHERE e.run_id = NEW.run_id;
        IF NEW.seq <> expected THEN
            RAISE EXCEPTION 'run_event seq % for run % is out of order: expected %', NEW.seq, NEW.run_id, expected
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RETURN NEW;
    ELSIF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'run_event is append-only: rows cannot be updated'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    -- DELETE: only the journal of a terminal run may go (trim_journal).
    IF NOT EXISTS (
        SELECT 1 FROM runrow.agent_run AS r
        WHERE r.id = OLD.run_id AND r.status IN ('completed', 'failed', 'cancelled', 'dead')
    ) THEN
        RAISE EXCEPTION 'run_event is append-only: the journal of run % is still live', OLD.run_id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN OLD;
END
$fn$;

CREATE TRIGGER run_event_guard
BEFORE INSERT OR UPDATE OR DELETE ON runrow.run_event
FOR EACH ROW EXECUTE FUNCTION runrow._run_event_guard();

CREATE FUNCTION runrow._no_truncate() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
BEGIN
    RAISE EXCEPTION '% cannot be truncated', TG_TABLE_NAME
        USING ERRCODE = 'integrity_constraint_violation';
END
$fn$;

CREATE TRIGGER run_event_no_truncate BEFORE TRUNCATE ON runrow.run_event
FOR EACH STATEMENT EXECUTE FUNCTION runrow._no_truncate();
CREATE TRIGGER agent_run_no_truncate BEFORE TRUNCATE ON runrow.agent_run
FOR EACH STATEMENT EXECUTE FUNCTION runrow._no_truncate();

CREATE FUNCTION runrow._prompt_immutable() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
BEGIN
    RAISE EXCEPTION 'prompt % is immutable: register a new prompt instead', OLD.id
        USING ERRCODE = 'integrity_constraint_violation';
END
$fn$;

CREATE TRIGGER prompt_immutable BEFORE UPDATE ON runrow.prompt
FOR EACH ROW EXECUTE FUNCTION runrow._prompt_immutable();

-- Message content never changes; only submitted -> draft (a stopped turn).
CREATE FUNCTION runrow._message_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'messages are never deleted' USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.id <> OLD.id OR NEW.conversation_id <> OLD.conversation_id
       OR NEW.content IS DISTINCT FROM OLD.content OR NEW.role <> OLD.role
       OR NEW.user_id IS DISTINCT FROM OLD.user_id OR NEW.created_at <> OLD.created_at
       OR NOT (NEW.status = OLD.status OR (OLD.status = 'submitted' AND NEW.status = 'draft')) THEN
        RAISE EXCEPTION 'message %: only submitted -> draft may change', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END
$fn$;

CREATE TRIGGER message_guard BEFORE UPDATE OR DELETE ON runrow.message
FOR EACH ROW EXECUTE FUNCTION runrow._message_guard();

-- Invariant 6: only the functions write. The roles get no table privileges beyond the
-- auditor's read access; the SECURITY DEFINER functions run as the owner.
REVOKE ALL ON ALL TABLES IN SCHEMA runrow FROM PUBLIC;
GRANT SELECT ON runrow.prompt, runrow.message, runrow.agent_run, runrow.run_event TO runrow_auditor;

-- At most one terminal `complete` event per run: the first ending wins, in the schema.
-- Also serves read_events' "does this journal already hold its ending?" lookup.
CREATE UNIQUE INDEX run_event_one_complete ON runrow.run_event (run_id)
WHERE type = 'complete';

-- A failed or dead run is retried at most once (retry_run returns the existing retry).
CREATE UNIQUE INDEX agent_run_one_retry ON runrow.agent_run (retry_of)
WHERE retry_of IS NOT NULL;
