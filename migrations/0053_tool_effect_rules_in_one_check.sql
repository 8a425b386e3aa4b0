-- depends: 0052_run_references_checked_at_insert
-- tool_effect's fourteen row rules are one CHECK constraint, tool_effect_rules, whose
-- expression is one call of an IMMUTABLE PL/pgSQL function, as 0045 made agent_run's six into
-- agent_run_state and 0048 agent_step's eight into agent_step_rules (issue 11: the fixed cost
-- of every begin_tool_call, complete_tool_call and interrupt_tool_call).
--
-- Why: PostgreSQL reads a CHECK's node text back (stringToNode) and compiles it for every
-- INSERT or UPDATE statement, before its first row. The fourteen were 11 kB of node text, and
-- about 500,000 of a begin_tool_call's 1.7 million instructions (python -m bench.api_calls, by
-- function: ExecConstraints 498k, stringToNode 288k), the key's regular expression 92,000 of
-- them. One call of seventeen columns is a short text; the function's expressions are compiled
-- once per session, and each row pays one function call. The key's rule tests its 64
-- characters with ltrim, not the regex engine: the same strings pass.
--
-- The rules, their order and their errors are the fourteen constraints': PostgreSQL checks a
-- table's CHECKs in the order of their names, and the function tests them in that order, each
-- once, raising 23514 with the message and constraint name (CONSTRAINT field) the failing
-- constraint raised. A rule whose value is NULL passes, as in a CHECK.
--
-- Added NOT VALID here and validated by 0054 in a transaction of its own (0045's reasons: no
-- scan under ACCESS EXCLUSIVE). The rows already there met the fourteen constraints it replaces.

CREATE FUNCTION runrow._tool_effect_rules_valid(
    idempotency_key text,
    tool_use_id text,
    tool text,
    args jsonb,
    effect text,
    state text,
    result jsonb,
    is_error boolean,
    result_step_seq integer,
    approved boolean,
    decided_by text,
    decision_note text,
    decided_at timestamptz,
    attempt integer,
    started_attempt integer,
    started_at timestamptz,
    completed_at timestamptz
) RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $fn$
DECLARE
    broken text;
BEGIN
    -- The first broken rule, in the order of the constraint names (PostgreSQL's order); NULL
    -- for a valid row. A rule whose value is NULL passes, as in a CHECK.
    broken := CASE
        WHEN NOT coalesce(jsonb_typeof(args) = 'object', TRUE)
            THEN 'tool_effect_args_check'
        WHEN NOT coalesce(attempt >= 1, TRUE)
            THEN 'tool_effect_attempt_check'
        WHEN NOT coalesce(decided_by <> '' AND length(decided_by) <= 200, TRUE)
            THEN 'tool_effect_decided_by_check'
        WHEN NOT coalesce(
            (approved IS NULL) = (decided_by IS NULL) AND (approved IS NULL) = (decided_at IS NULL), TRUE
        )
            THEN 'tool_effect_decision_complete'
        WHEN NOT coalesce(length(decision_note) <= 10000, TRUE)
            THEN 'tool_effect_decision_note_check'
        WHEN NOT coalesce((state = 'done') = (
            result IS NOT NULL AND is_error IS NOT NULL AND result_step_seq IS NOT NULL AND completed_at IS NOT NULL
        ), TRUE)
            THEN 'tool_effect_done_iff_result'
        WHEN NOT coalesce(effect IN ('pure', 'idempotent', 'non_idempotent', 'irreversible'), TRUE)
            THEN 'tool_effect_effect_check'
        WHEN NOT coalesce(
            length(idempotency_key) = 64 AND ltrim(idempotency_key, '0123456789abcdef') = '', TRUE
        )
            THEN 'tool_effect_idempotency_key_check'
        WHEN NOT coalesce(
            effect <> 'irreversible' OR state NOT IN ('executing', 'approved', 'uncertain') OR approved IS TRUE, TRUE
        )
            THEN 'tool_effect_irreversible_needs_yes'
        WHEN NOT coalesce(started_attempt >= 1, TRUE)
            THEN 'tool_effect_started_attempt_check'
        WHEN NOT coalesce((started_attempt IS NULL) = (started_at IS NULL), TRUE)
            THEN 'tool_effect_started_together'
        WHEN NOT coalesce(
            state IN ('executing', 'needs_approval', 'approved', 'rejected', 'uncertain', 'done'), TRUE
        )
            THEN 'tool_effect_state_check'
        WHEN NOT coalesce(tool <> '', TRUE)
            THEN 'tool_effect_tool_check'
        WHEN NOT coalesce(tool_use_id <> '', TRUE)
            THEN 'tool_effect_tool_use_id_check'
    END;
    IF broken IS NULL THEN
        RETURN TRUE;
    END IF;
    RAISE EXCEPTION 'new row for relation "tool_effect" violates check constraint "%"', broken
        USING ERRCODE = 'check_violation', CONSTRAINT = broken, TABLE = 'tool_effect', SCHEMA = 'runrow';
END
$fn$;

REVOKE ALL ON FUNCTION runrow._tool_effect_rules_valid(
    text, text, text, jsonb, text, text, jsonb, boolean, integer, boolean, text, text, timestamptz,
    integer, integer, timestamptz, timestamptz
) FROM PUBLIC;

COMMENT ON FUNCTION runrow._tool_effect_rules_valid(
    text, text, text, jsonb, text, text, jsonb, boolean, integer, boolean, text, text, timestamptz,
    integer, integer, timestamptz, timestamptz
) IS
'The expression of tool_effect''s CHECK constraint tool_effect_rules: TRUE when the row meets the '
'fourteen rules (args_check: args is a JSON object; attempt_check: attempt >= 1; '
'decided_by_check: NULL or 1 to 200 characters; decision_complete: approved, decided_by and '
'decided_at all set or all NULL; decision_note_check: at most 10,000 characters; '
'done_iff_result: done exactly when result, is_error, result_step_seq and completed_at are all '
'set; effect_check: pure, idempotent, non_idempotent or irreversible; idempotency_key_check: 64 '
'lowercase hex characters; irreversible_needs_yes: an irreversible call is executing, approved '
'or uncertain only once approved; started_attempt_check: NULL or >= 1; started_together: '
'started_attempt and started_at both set or both NULL; state_check: a known state; tool_check '
'and tool_use_id_check: not empty), a rule whose value is NULL passing as in a CHECK. Otherwise '
'it raises 23514 naming the first broken rule, in name order, as tool_effect_<rule>, with the '
'message PostgreSQL gives a failed CHECK. IMMUTABLE: it reads its arguments only.';

ALTER TABLE runrow.tool_effect
ADD CONSTRAINT tool_effect_rules CHECK (
    runrow._tool_effect_rules_valid(
        idempotency_key, tool_use_id, tool, args, effect, state, result, is_error, result_step_seq,
        approved, decided_by, decision_note, decided_at, attempt, started_attempt, started_at, completed_at
    )
) NOT VALID,
DROP CONSTRAINT tool_effect_args_check,
DROP CONSTRAINT tool_effect_attempt_check,
DROP CONSTRAINT tool_effect_decided_by_check,
DROP CONSTRAINT tool_effect_decision_complete,
DROP CONSTRAINT tool_effect_decision_note_check,
DROP CONSTRAINT tool_effect_done_iff_result,
DROP CONSTRAINT tool_effect_effect_check,
DROP CONSTRAINT tool_effect_idempotency_key_check,
DROP CONSTRAINT tool_effect_irreversible_needs_yes,
DROP CONSTRAINT tool_effect_started_attempt_check,
DROP CONSTRAINT tool_effect_started_together,
DROP CONSTRAINT tool_effect_state_check,
DROP CONSTRAINT tool_effect_tool_check,
DROP CONSTRAINT tool_effect_tool_use_id_check;
