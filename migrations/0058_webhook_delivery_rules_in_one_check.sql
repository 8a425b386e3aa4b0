-- depends: 0057_message_rules_validated
-- webhook_delivery's nine row rules are one CHECK constraint, webhook_delivery_rules, whose
-- expression is one call of an IMMUTABLE PL/pgSQL function, as 0045, 0048, 0053 and 0056 did
-- for agent_run, agent_step, tool_effect and message (issue 11: the fixed cost of every
-- delivery's insert, claim, completion and failure, three or more statements per run with a
-- webhook).
--
-- Why: PostgreSQL reads a CHECK's node text back (stringToNode) and compiles it for every
-- INSERT or UPDATE statement, before its first row. The nine were 6 kB of node text. One call
-- of ten columns is a short text; the function's expressions are compiled once per session,
-- and each row pays one function call.
--
-- The rules, their order and their errors are the nine constraints': PostgreSQL checks a
-- table's CHECKs in the order of their names, and the function tests them in that order, each
-- once, raising 23514 with the message and constraint name (CONSTRAINT field) the failing
-- constraint raised. A rule whose value is NULL passes, as in a CHECK.
--
-- Added NOT VALID here and validated by 0059 in a transaction of its own (0045's reasons: no
-- scan under ACCESS EXCLUSIVE). The rows already there met the nine constraints it replaces.

CREATE FUNCTION runrow._webhook_delivery_rules_valid(
    url text,
    payload jsonb,
    state text,
    attempts integer,
    claim_token uuid,
    claim_expires_at timestamptz,
    last_error text,
    last_http_status integer,
    delivered_at timestamptz
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
        WHEN NOT coalesce(attempts >= 0, TRUE)
            THEN 'webhook_delivery_attempts_check'
        WHEN NOT coalesce((state = 'delivered') = (delivered_at IS NOT NULL), TRUE)
            THEN 'webhook_delivery_delivered_at'
        WHEN NOT coalesce(length(last_error) <= 10000, TRUE)
            THEN 'webhook_delivery_last_error_check'
        WHEN NOT coalesce(last_http_status >= 100 AND last_http_status <= 599, TRUE)
            THEN 'webhook_delivery_last_http_status_check'
        WHEN NOT coalesce(state = 'pending' OR claim_token IS NULL, TRUE)
            THEN 'webhook_delivery_lease_only_pending'
        WHEN NOT coalesce((claim_token IS NULL) = (claim_expires_at IS NULL), TRUE)
            THEN 'webhook_delivery_lease_whole'
        WHEN NOT coalesce(jsonb_typeof(payload) = 'object', TRUE)
            THEN 'webhook_delivery_payload_check'
        WHEN NOT coalesce(state IN ('pending', 'delivered', 'dead'), TRUE)
            THEN 'webhook_delivery_state_check'
        WHEN NOT coalesce(length(url) <= 2048 AND url ~ '^https?://[^[:space:]]+$', TRUE)
            THEN 'webhook_delivery_url_check'
    END;
    IF broken IS NULL THEN
        RETURN TRUE;
    END IF;
    RAISE EXCEPTION 'new row for relation "webhook_delivery" violates check constraint "%"', broken
        USING ERRCODE = 'check_violation', CONSTRAINT = broken, TABLE = 'webhook_delivery', SCHEMA = 'runrow';
END
$fn$;

REVOKE ALL ON FUNCTION runrow._webhook_delivery_rules_valid(
    text, jsonb, text, integer, uuid, timestamptz, text, integer, timestamptz
) FROM PUBLIC;

COMMENT ON FUNCTION runrow._webhook_delivery_rules_valid(
    text, jsonb, text, integer, uuid, timestamptz, text, integer, timestamptz
) IS
'The expression of webhook_delivery''s CHECK constraint webhook_delivery_rules: TRUE when the '
'row meets the nine rules (attempts_check: attempts >= 0; delivered_at: set exactly when '
'delivered; last_error_check: at most 10,000 characters; last_http_status_check: 100 to 599; '
'lease_only_pending: a claim token only while pending; lease_whole: token and expiry both set or '
'both NULL; payload_check: a JSON object; state_check: pending, delivered or dead; url_check: an '
'http:// or https:// URL of at most 2048 characters), a rule whose value is NULL passing as in a '
'CHECK. Otherwise it raises 23514 naming the first broken rule, in name order, as '
'webhook_delivery_<rule>, with the message PostgreSQL gives a failed CHECK. IMMUTABLE: it reads '
'its arguments only.';

ALTER TABLE runrow.webhook_delivery
ADD CONSTRAINT webhook_delivery_rules CHECK (
    runrow._webhook_delivery_rules_valid(
        url, payload, state, attempts, claim_token, claim_expires_at, last_error, last_http_status, delivered_at
    )
) NOT VALID,
DROP CONSTRAINT webhook_delivery_attempts_check,
DROP CONSTRAINT webhook_delivery_delivered_at,
DROP CONSTRAINT webhook_delivery_last_error_check,
DROP CONSTRAINT webhook_delivery_last_http_status_check,
DROP CONSTRAINT webhook_delivery_lease_only_pending,
DROP CONSTRAINT webhook_delivery_lease_whole,
DROP CONSTRAINT webhook_delivery_payload_check,
DROP CONSTRAINT webhook_delivery_state_check,
DROP CONSTRAINT webhook_delivery_url_check;
