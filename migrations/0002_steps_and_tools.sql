-- runrow durable steps and tools: the step log (agent_step), tool effects with their
-- idempotency keys, intents and approvals (tool_effect), and the view of what waits on
-- a person (pending_approvals). Invariants live here; functions/ adds the API.
-- depends: 0001_core

-- The durable step log: the conversation as the model and the tools produced it.
-- payload is `json`, not `jsonb`: json keeps the input text as is (key order,
-- whitespace, escapes, duplicate keys), so the bytes the SDK produced are the bytes
-- read back, which signed thinking blocks require.
CREATE TABLE runrow.agent_step (
    run_id uuid NOT NULL REFERENCES runrow.agent_run (id),
    seq integer NOT NULL CHECK (seq >= 1),
    -- model_turn: the assistant message's content array (one API message).
    -- tool_result: one tool_result content block; consecutive ones form one user message.
    -- These are the only two things a Messages API conversation is built from after the
    -- user's message; anything else a worker wants to record belongs in the journal.
    kind text NOT NULL CHECK (kind IN ('model_turn', 'tool_result')),
    payload json NOT NULL,
    -- The tool_use block a tool_result answers (derived, so it cannot disagree with the
    -- payload); keeps "one result per tool_use" in the schema.
    tool_use_id text GENERATED ALWAYS AS (
        CASE WHEN kind = 'tool_result' THEN payload ->> 'tool_use_id' END
    ) STORED,
    request_id text CHECK (request_id <> '' AND length(request_id) <= 255),
    attempt integer NOT NULL CHECK (attempt >= 1),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq),
    CONSTRAINT agent_step_tool_result_names_its_tool_use CHECK (
        kind <> 'tool_result' OR (tool_use_id IS NOT NULL AND tool_use_id <> '')
    )
);

COMMENT ON TABLE runrow.agent_step IS
'The durable step log of each run, keyed (run_id, seq); seq starts at 1 and has no gaps. '
'Append-only for every role, the owner included (triggers reject UPDATE, DELETE and '
'TRUNCATE). payload is json, stored and returned byte for byte as written: model_turn = the '
'assistant message content array, tool_result = one tool_result block. trim_journal never '
'touches it.';

-- At most one tool_result per tool_use in a run.
CREATE UNIQUE INDEX agent_step_one_result_per_tool_use
ON runrow.agent_step (run_id, tool_use_id)
WHERE kind = 'tool_result';

-- "The run's latest model turn" (append_step, begin_tool_call).
CREATE INDEX agent_step_model_turns ON runrow.agent_step (run_id, seq)
WHERE kind = 'model_turn';

CREATE FUNCTION runrow._agent_step_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    expected integer;
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- Invariant 4: the next seq, no gap, no reuse.
        SELECT coalesce(max(s.seq), 0) + 1 INTO expected
        FROM runrow.agent_step AS s WHERE s.run_id = NEW.run_id;
        IF NEW.seq <> expected THEN
            RAISE EXCEPTION 'agent_step seq % for run % is out of order: expected %', NEW.seq, NEW.run_id, expected
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'agent_step is append-only: rows cannot be %d', lower(TG_OP)
        USING ERRCODE = 'integrity_constraint_violation',
              HINT = 'Steps are the record of a run; a correction is a new step.';
END
$fn$;

CREATE TRIGGER agent_step_guard
BEFORE INSERT OR UPDATE OR DELETE ON runrow.agent_step
FOR EACH ROW EXECUTE FUNCTION runrow._agent_step_guard();

CREATE TRIGGER agent_step_no_truncate BEFORE TRUNCATE ON runrow.agent_step
FOR EACH STATEMENT EXECUTE FUNCTION runrow._no_truncate();

-- Tool effects: one row per tool call that went through begin_tool_call.
--
-- state (see _tool_effect_guard for the legal moves):
--   executing       execution may have started and no result is recorded (pure,
--                   idempotent, non_idempotent from their first begin; irreversible only
--                   after a person approved and a worker began it)
--   needs_approval  irreversible: the intent is recorded, a person must decide first
--   approved        a person approved; no worker has begun it yet
--   rejected        a person rejected; the worker reports that to the model
--   uncertain       irreversible, begun, no result, and begun again: it may or may not
--                   have happened; a person decides
--   done            the result is recorded (and its tool_result step appended)
CREATE TABLE runrow.tool_effect (
    idempotency_key text PRIMARY KEY CHECK (idempotency_key ~ '^[0-9a-f]{64}$'),
    run_id uuid NOT NULL,
    -- The model_turn step holding the tool_use block this call answers.
    step_seq integer NOT NULL,
    tool_use_id text NOT NULL CHECK (tool_use_id <> ''),
    tool text NOT NULL CHECK (tool <> ''),
    args jsonb NOT NULL CHECK (jsonb_typeof(args) = 'object'),
    effect text NOT NULL CHECK (effect IN ('pure', 'idempotent', 'non_idempotent', 'irreversible')),
    state text NOT NULL CHECK (
        state IN ('executing', 'needs_approval', 'approved', 'rejected', 'uncertain', 'done')
    ),
    result jsonb,
    is_error boolean,
    -- The tool_result step appended with the result.
    result_step_seq integer,
    -- The latest decision of a person (an uncertain intent can be decided after an
    -- earlier approval; the journal keeps every decision as approval_resolved).
    approved boolean,
    decided_by text CHECK (decided_by <> '' AND length(decided_by) <= 200),
    decision_note text CHECK (length(decision_note) <= 10000),
    decided_at timestamptz,
    -- The run attempt that recorded the call, and the one that last began executing it.
    attempt integer NOT NULL CHECK (attempt >= 1),
    started_attempt integer CHECK (started_attempt >= 1),
    started_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz,
    FOREIGN KEY (run_id, step_seq) REFERENCES runrow.agent_step (run_id, seq),
    FOREIGN KEY (run_id, result_step_seq) REFERENCES runrow.agent_step (run_id, seq),
    CONSTRAINT tool_effect_done_iff_result CHECK (
        (state = 'done') = (
            result IS NOT NULL AND is_error IS NOT NULL
            AND result_step_seq IS NOT NULL AND completed_at IS NOT NULL
        )
    ),
    CONSTRAINT tool_effect_decision_complete CHECK (
        (approved IS NULL) = (decided_by IS NULL) AND (approved IS NULL) = (decided_at IS NULL)
    ),
    CONSTRAINT tool_effect_started_together CHECK ((started_attempt IS NULL) = (started_at IS NULL)),
    -- Nothing irreversible runs without a person's yes.
    CONSTRAINT tool_effect_irreversible_needs_yes CHECK (
        effect <> 'irreversible' OR state NOT IN ('executing', 'approved', 'uncertain')
        OR approved IS TRUE
    )
);

COMMENT ON TABLE runrow.tool_effect IS
'One row per tool call begun through begin_tool_call, keyed by its idempotency key '
'(runrow.tool_call_key). state: executing, needs_approval, approved, rejected, uncertain, '
'done. Moves are checked by a trigger; once done (result recorded) a row never changes, '
'and no row is ever deleted. Written only by begin_tool_call, complete_tool_call and '
'resolve_approval.';

-- Invariant 5 for tools: one effect per tool_use block.
CREATE UNIQUE INDEX tool_effect_one_per_tool_use ON runrow.tool_effect (run_id, tool_use_id);
CREATE INDEX tool_effect_by_step ON runrow.tool_effect (run_id, step_seq);
-- What waits on a person (pending_approvals) and open intents (audit), without
-- scanning the done rows that make up history.
CREATE INDEX tool_effect_pending ON runrow.tool_effect (updated_at)
WHERE state IN ('needs_approval', 'uncertain');
CREATE INDEX tool_effect_open ON runrow.tool_effect (created_at)
WHERE state <> 'done';

CREATE FUNCTION runrow._tool_effect_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'tool_effect rows are never deleted (key %)', OLD.idempotency_key
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF TG_OP = 'INSERT' THEN
        -- A call starts executing, or, when irreversible, as an intent awaiting a person.
        IF NOT ((NEW.effect = 'irreversible' AND NEW.state = 'needs_approval')
                OR (NEW.effect <> 'irreversible' AND NEW.state = 'executing')) THEN
            RAISE EXCEPTION 'tool_effect %: a % call cannot start in state %', NEW.idempotency_key, NEW.effect, NEW.state
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        IF NEW.result IS NOT NULL OR NEW.approved IS NOT NULL THEN
            RAISE EXCEPTION 'tool_effect %: a new call has no result and no decision', NEW.idempotency_key
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RETURN NEW;
    END IF;
    -- UPDATE. A recorded result is final: nothing about a done row changes.
    IF OLD.state = 'done' THEN
        RAISE EXCEPTION 'tool_effect %: the result is recorded and immutable', OLD.idempotency_key
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.idempotency_key <> OLD.idempotency_key OR NEW.run_id <> OLD.run_id
       OR NEW.step_seq <> OLD.step_seq OR NEW.tool_use_id <> OLD.tool_use_id
       OR NEW.tool <> OLD.tool OR NEW.args <> OLD.args OR NEW.effect <> OLD.effect
       OR NEW.attempt <> OLD.attempt OR NEW.created_at <> OLD.created_at THEN
        RAISE EXCEPTION 'tool_effect %: key, run, step, tool_use, tool, args, effect and attempt are immutable',
            OLD.idempotency_key
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NOT (
        -- begun again (not irreversible: those become uncertain instead)
        (OLD.state = 'executing' AND NEW.state = 'executing' AND OLD.effect <> 'irreversible')
        OR (OLD.state = 'executing' AND NEW.state = 'done')
        OR (OLD.state = 'executing' AND NEW.state = 'uncertain' AND OLD.effect = 'irreversible')
        OR (OLD.state IN ('needs_approval', 'uncertain') AND NEW.state IN ('approved', 'rejected'))
        OR (OLD.state = 'approved' AND NEW.state = 'executing')
        -- the rejection reported to the model
        OR (OLD.state = 'rejected' AND NEW.state = 'done')
    ) THEN
        RAISE EXCEPTION 'tool_effect %: illegal state change % -> %', OLD.idempotency_key, OLD.state, NEW.state
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    -- A decision is made only when leaving needs_approval/uncertain, and is then kept.
    IF OLD.state IN ('needs_approval', 'uncertain') THEN
        IF NEW.approved IS NULL OR NEW.approved <> (NEW.state = 'approved') OR NEW.decided_by IS NULL THEN
            RAISE EXCEPTION 'tool_effect %: leaving % needs a fresh decision that matches the new state',
                OLD.idempotency_key, OLD.state
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
    ELSIF NEW.approved IS DISTINCT FROM OLD.approved OR NEW.decided_by IS DISTINCT FROM OLD.decided_by
          OR NEW.decision_note IS DISTINCT FROM OLD.decision_note
          OR NEW.decided_at IS DISTINCT FROM OLD.decided_at THEN
        RAISE EXCEPTION 'tool_effect %: a decision is recorded only by resolve_approval', OLD.idempotency_key
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF OLD.state = 'rejected' AND NEW.is_error IS NOT TRUE THEN
        RAISE EXCEPTION 'tool_effect %: a rejected call is reported as an error', OLD.idempotency_key
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END
$fn$;

CREATE TRIGGER tool_effect_guard
BEFORE INSERT OR UPDATE OR DELETE ON runrow.tool_effect
FOR EACH ROW EXECUTE FUNCTION runrow._tool_effect_guard();

CREATE TRIGGER tool_effect_no_truncate BEFORE TRUNCATE ON runrow.tool_effect
FOR EACH STATEMENT EXECUTE FUNCTION runrow._no_truncate();

-- What waits on a person: irreversible intents awaiting approval and uncertain intents,
-- of runs parked as waiting. The view runs with its owner's rights, so the client role
-- reads it without any right on the tables.
CREATE VIEW runrow.pending_approvals AS
SELECT
    e.idempotency_key,
    e.state AS reason,
    e.run_id,
    r.conversation_id,
    r.user_id,
    e.tool,
    e.args,
    e.effect,
    e.tool_use_id,
    e.step_seq,
    e.approved AS previously_approved,
    e.decided_by AS previously_decided_by,
    e.started_at,
    e.created_at,
    e.updated_at AS waiting_since
FROM runrow.tool_effect AS e
INNER JOIN runrow.agent_run AS r ON e.run_id = r.id
WHERE
    e.state IN ('needs_approval', 'uncertain')
    AND r.status = 'waiting';

COMMENT ON VIEW runrow.pending_approvals IS
'Tool calls waiting on a person, one row per idempotency key: reason needs_approval (an '
'irreversible call not yet run) or uncertain (an irreversible call that began and has no '
'result: it may have happened). Decide with runrow.resolve_approval(idempotency_key, '
'approved, decided_by, note). Only calls of runs parked as waiting are listed.';

REVOKE ALL ON runrow.agent_step, runrow.tool_effect, runrow.pending_approvals FROM PUBLIC;
GRANT SELECT ON runrow.agent_step, runrow.tool_effect TO runrow_auditor;
GRANT SELECT ON runrow.pending_approvals TO runrow_client, runrow_auditor;
