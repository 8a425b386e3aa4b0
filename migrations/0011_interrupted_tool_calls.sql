-- A tool call the worker cut short (a stop, a drain) can be recorded as interrupted
-- (runrow.interrupt_tool_call). For a non_idempotent call that means uncertain, exactly
-- as for an irreversible one: it may have happened half-way, and running it again, even
-- with the same key, is a guess only a person may make. Until now the guard allowed
-- executing -> uncertain for irreversible calls only; a crashed non_idempotent call still
-- runs again with its key (the downstream service dedups), because a crash says nothing
-- about how far the tool got, while an interruption is a known cut in the middle.
-- depends: 0010_nul_safe_steps_and_request_fingerprint

CREATE OR REPLACE FUNCTION runrow._tool_effect_guard() RETURNS trigger
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
        -- irreversible begun again, or either unsafe class cut short mid-way
        OR (OLD.state = 'executing' AND NEW.state = 'uncertain' AND OLD.effect IN ('non_idempotent', 'irreversible'))
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

COMMENT ON TABLE runrow.tool_effect IS
'One row per tool call begun through begin_tool_call, keyed by its idempotency key '
'(runrow.tool_call_key). state: executing, needs_approval, approved, rejected, uncertain '
'(an irreversible call begun again without a result, or a non_idempotent or irreversible call '
'the worker cut short: it may have happened), done. Moves are checked by a trigger; once done '
'(result recorded) a row never changes, and no row is ever deleted. Written only by '
'begin_tool_call, complete_tool_call, interrupt_tool_call and resolve_approval.';

COMMENT ON VIEW runrow.open_tool_effects IS
'Every tool call without a recorded result (state other than done), for the auditor; the '
'client''s view is pending_approvals. may_have_happened: the call began and no result is '
'recorded (executing, or uncertain: an irreversible call begun again after a crash, or a '
'non_idempotent or irreversible call cut short by a stop or a drain). '
'attention: awaiting_decision (needs_approval or uncertain, run waiting: resolve_approval), '
'in_flight (executing in a running run), interrupted (executing, its run no longer running: '
'the next attempt executes it again, or makes it uncertain when irreversible), '
'awaiting_resume (approved or rejected, or uncertain in a queued run that will park on it), '
'abandoned (the run ended with the call open: nothing will complete it; if '
'may_have_happened, check the tool''s side with its idempotency key). '
'age = since the call was recorded, state_age = since its last state change. Served by '
'tool_effect_open.';

COMMENT ON VIEW runrow.pending_approvals IS
'Tool calls waiting on a person, one row per idempotency key: reason needs_approval (an '
'irreversible call not yet run) or uncertain (an irreversible call that began and has no '
'result, or a non_idempotent or irreversible call a worker cut short: it may have happened). '
'Decide with runrow.resolve_approval(idempotency_key, approved, decided_by, note). Only calls '
'of runs parked as waiting are listed.';
