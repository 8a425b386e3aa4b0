-- depends: 0047_journal_row_rules_in_its_guard
-- agent_step's eight row rules are one CHECK constraint, agent_step_rules, whose expression is
-- one call of an IMMUTABLE PL/pgSQL function, as 0045 made agent_run's six into agent_run_state
-- (issue 11: the fixed cost of every append_step and complete_tool_call).
--
-- Why: PostgreSQL reads a CHECK's node text back (stringToNode) and compiles it for every
-- INSERT statement, before its first row. The eight CHECKs were about a third of an
-- append_step's backend work (python -m bench.api_calls, by function: stringToNode 158k and
-- ExecConstraints 229k of 873k instructions). One call of seven columns is a short text; the
-- function's expressions are compiled once per session, and each row pays one function call.
--
-- The rules, their order and their errors are the eight constraints': PostgreSQL checks a
-- table's CHECKs in the order of their names, and the function tests them in that order, each
-- once, raising 23514 with the message and constraint name (CONSTRAINT field) the failing
-- constraint raised. A rule whose value is NULL passes, as in a CHECK. tool_use_id is the
-- guard trigger's (BEFORE INSERT), which runs before CHECKs, as it did before.
--
-- Added NOT VALID here and validated by 0049 in a transaction of its own (0045's reasons: no
-- scan under ACCESS EXCLUSIVE). The rows already there met the eight constraints it replaces.

CREATE FUNCTION runrow._agent_step_rules_valid(
    kind text,
    seq integer,
    request_id text,
    attempt integer,
    tool_use_id text,
    usage jsonb,
    stop_reason text
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
        WHEN NOT coalesce(attempt >= 1, TRUE)
            THEN 'agent_step_attempt_check'
        WHEN NOT coalesce(kind IN ('model_turn', 'tool_result'), TRUE)
            THEN 'agent_step_kind_check'
        WHEN NOT coalesce(request_id <> '' AND length(request_id) <= 255, TRUE)
            THEN 'agent_step_request_id_check'
        WHEN NOT coalesce(seq >= 1, TRUE)
            THEN 'agent_step_seq_check'
        WHEN NOT coalesce(stop_reason <> '' AND length(stop_reason) <= 64, TRUE)
            THEN 'agent_step_stop_reason_check'
        WHEN NOT coalesce(kind <> 'tool_result' OR (tool_use_id IS NOT NULL AND tool_use_id <> ''), TRUE)
            THEN 'agent_step_tool_result_names_its_tool_use'
        WHEN NOT coalesce(usage IS NULL OR jsonb_typeof(usage) = 'object', TRUE)
            THEN 'agent_step_usage_check'
        WHEN NOT coalesce(kind = 'model_turn' OR (usage IS NULL AND stop_reason IS NULL), TRUE)
            THEN 'agent_step_usage_only_on_model_turns'
    END;
    IF broken IS NULL THEN
        RETURN TRUE;
    END IF;
    RAISE EXCEPTION 'new row for relation "agent_step" violates check constraint "%"', broken
        USING ERRCODE = 'check_violation', CONSTRAINT = broken, TABLE = 'agent_step', SCHEMA = 'runrow';
END
$fn$;

REVOKE ALL ON FUNCTION runrow._agent_step_rules_valid(
    text, integer, text, integer, text, jsonb, text
) FROM PUBLIC;

COMMENT ON FUNCTION runrow._agent_step_rules_valid(
    text, integer, text, integer, text, jsonb, text
) IS
'The expression of agent_step''s CHECK constraint agent_step_rules: TRUE when the row meets the '
'eight rules (attempt_check: attempt >= 1; kind_check: model_turn or tool_result; '
'request_id_check: NULL or 1 to 255 characters; seq_check: seq >= 1; stop_reason_check: NULL or '
'1 to 64 characters; tool_result_names_its_tool_use: a tool_result has a non-empty tool_use_id; '
'usage_check: NULL or a JSON object; usage_only_on_model_turns: usage and stop_reason only on a '
'model_turn), a rule whose value is NULL passing as in a CHECK. Otherwise it raises 23514 naming '
'the first broken rule, in name order, as agent_step_<rule>, with the message PostgreSQL gives a '
'failed CHECK. IMMUTABLE: it reads its arguments only.';

ALTER TABLE runrow.agent_step
ADD CONSTRAINT agent_step_rules CHECK (
    runrow._agent_step_rules_valid(kind, seq, request_id, attempt, tool_use_id, usage, stop_reason)
) NOT VALID,
DROP CONSTRAINT agent_step_attempt_check,
DROP CONSTRAINT agent_step_kind_check,
DROP CONSTRAINT agent_step_request_id_check,
DROP CONSTRAINT agent_step_seq_check,
DROP CONSTRAINT agent_step_stop_reason_check,
DROP CONSTRAINT agent_step_tool_result_names_its_tool_use,
DROP CONSTRAINT agent_step_usage_check,
DROP CONSTRAINT agent_step_usage_only_on_model_turns;

COMMENT ON CONSTRAINT agent_step_rules ON runrow.agent_step IS
'The eight row rules of a step (runrow._agent_step_rules_valid), one call instead of eight '
'expressions compiled per statement (0048).';
