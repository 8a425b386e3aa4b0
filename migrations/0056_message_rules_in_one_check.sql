-- depends: 0055_uuidv7_inlined
-- message's three row rules are one CHECK constraint, message_rules, whose expression is one
-- call of an IMMUTABLE PL/pgSQL function, as 0045, 0048 and 0053 did for agent_run,
-- agent_step and tool_effect (issue 11: the fixed cost of every enqueue_run, which inserts
-- the turn's message).
--
-- Why: PostgreSQL reads a CHECK's node text back (stringToNode) and compiles it for every
-- INSERT statement, before its first row. The three were 3.5 kB of node text; without them an
-- enqueue cost 135,000 fewer of its 1.61 million instructions (python -m bench.api_calls).
-- One call of three columns is a short text; the function's expressions are compiled once
-- per session, and each row pays one function call.
--
-- The rules, their order and their errors are the three constraints': PostgreSQL checks a
-- table's CHECKs in the order of their names, and the function tests them in that order, each
-- once, raising 23514 with the message and constraint name (CONSTRAINT field) the failing
-- constraint raised. A rule whose value is NULL passes, as in a CHECK.
--
-- Added NOT VALID here and validated by 0057 in a transaction of its own (0045's reasons: no
-- scan under ACCESS EXCLUSIVE). The rows already there met the three constraints it replaces.

CREATE FUNCTION runrow._message_rules_valid(
    role text,
    content jsonb,
    status text
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
        WHEN NOT coalesce(
            (jsonb_typeof(content) = 'string' AND content #>> '{}' <> '')
            OR (jsonb_typeof(content) = 'array' AND jsonb_array_length(content) > 0),
            TRUE
        )
            THEN 'message_content_check'
        WHEN NOT coalesce(role = 'user', TRUE)
            THEN 'message_role_check'
        WHEN NOT coalesce(status IN ('submitted', 'draft'), TRUE)
            THEN 'message_status_check'
    END;
    IF broken IS NULL THEN
        RETURN TRUE;
    END IF;
    RAISE EXCEPTION 'new row for relation "message" violates check constraint "%"', broken
        USING ERRCODE = 'check_violation', CONSTRAINT = broken, TABLE = 'message', SCHEMA = 'runrow';
END
$fn$;

REVOKE ALL ON FUNCTION runrow._message_rules_valid(text, jsonb, text) FROM PUBLIC;

COMMENT ON FUNCTION runrow._message_rules_valid(text, jsonb, text) IS
'The expression of message''s CHECK constraint message_rules: TRUE when the row meets the three '
'rules (content_check: a non-empty JSON string or a non-empty array of content blocks; '
'role_check: user; status_check: submitted or draft), a rule whose value is NULL passing as in '
'a CHECK. Otherwise it raises 23514 naming the first broken rule, in name order, as '
'message_<rule>, with the message PostgreSQL gives a failed CHECK. IMMUTABLE: it reads its '
'arguments only.';

ALTER TABLE runrow.message
ADD CONSTRAINT message_rules CHECK (runrow._message_rules_valid(role, content, status)) NOT VALID,
DROP CONSTRAINT message_content_check,
DROP CONSTRAINT message_role_check,
DROP CONSTRAINT message_status_check;
