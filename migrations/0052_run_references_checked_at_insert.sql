-- depends: 0051_agent_step_seq_from_its_guard
-- A new run's three references (its conversation, its message, its prompt) are checked by one
-- lookup in agent_run's BEFORE INSERT trigger, which already read the conversation for its
-- owner, instead of two foreign keys and 0050's separate prompt lookup (issue 11: the writes
-- and statements of an enqueue).
--
-- Why: the foreign keys agent_run.conversation_id -> conversation and agent_run.user_message_id
-- -> message each checked a new run with a query of its own that key-share locked the row it
-- found: two statements and two WAL records (Heap/LOCK) per enqueue, on rows the enqueue had
-- just written or read. 0050 had replaced the prompt's foreign key the same way, with a lookup of
-- its own in agent_run_settings. All three rows are now read in the one statement with which
-- agent_run_owner_guard read the conversation's owner, without a lock: none of them is ever
-- deleted or has its id changed (conversation_immutable, message_guard, prompt_immutable; and
-- TRUNCATE is refused on all three), and a run's references never change
-- (agent_run_identity_guard), so rows that exist when the run is inserted exist as long as it.
--
-- Unchanged: a run in someone else's conversation is refused first (42501, as before); then a
-- missing conversation, message or prompt with the foreign key's error (23503, its message and
-- constraint name), in that order.
--
-- Measured: see the commit message.

ALTER TABLE runrow.agent_run
DROP CONSTRAINT agent_run_conversation_fk,
DROP CONSTRAINT agent_run_user_message_id_fkey;

CREATE TRIGGER conversation_no_truncate BEFORE TRUNCATE ON runrow.conversation
FOR EACH STATEMENT EXECUTE FUNCTION runrow._no_truncate();
CREATE TRIGGER message_no_truncate BEFORE TRUNCATE ON runrow.message
FOR EACH STATEMENT EXECUTE FUNCTION runrow._no_truncate();

CREATE OR REPLACE FUNCTION runrow._run_owner_guard() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
DECLARE
    refs record;
    missing text;
BEGIN
    -- One statement reads the three rows a run refers to: their existence, and the
    -- conversation's owner.
    SELECT c.id IS NOT NULL AS conversation, c.user_id AS owner, m.id IS NOT NULL AS message,
           p.id IS NOT NULL AS prompt
    INTO refs
    FROM (SELECT) AS one
    LEFT JOIN runrow.conversation AS c ON c.id = NEW.conversation_id
    LEFT JOIN runrow.message AS m ON m.id = NEW.user_message_id
    LEFT JOIN runrow.prompt AS p ON p.id = NEW.prompt_id;
    IF NEW.user_id IS DISTINCT FROM refs.owner THEN
        RAISE EXCEPTION 'run %: user % does not own conversation %', NEW.id, NEW.user_id, NEW.conversation_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    missing := CASE
        WHEN NOT refs.conversation THEN 'agent_run_conversation_fk'
        WHEN NOT refs.message THEN 'agent_run_user_message_id_fkey'
        WHEN NOT refs.prompt THEN 'agent_run_prompt_id_fkey'
    END;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'insert or update on table "agent_run" violates foreign key constraint "%"', missing
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = missing, SCHEMA = 'runrow', TABLE = 'agent_run',
                  DETAIL = CASE missing
                      WHEN 'agent_run_conversation_fk' THEN format(
                          'Key (conversation_id)=(%s) is not present in table "conversation".', NEW.conversation_id)
                      WHEN 'agent_run_user_message_id_fkey' THEN format(
                          'Key (user_message_id)=(%s) is not present in table "message".', NEW.user_message_id)
                      ELSE format('Key (prompt_id)=(%s) is not present in table "prompt".', NEW.prompt_id)
                  END;
    END IF;
    RETURN NEW;
END
$fn$;

COMMENT ON FUNCTION runrow._run_owner_guard() IS
'agent_run''s BEFORE INSERT row trigger: a new run''s user owns its conversation (42501 otherwise), '
'and its conversation, message and prompt exist (23503 with the message and constraint name of the '
'foreign keys agent_run_conversation_fk, agent_run_user_message_id_fkey and agent_run_prompt_id_fkey '
'that checked them until 0050 and 0052), read in one statement without a row lock: none of those '
'rows is ever deleted or re-keyed, and a run''s references never change.';

-- 0050's prompt lookup moves into the statement above.
CREATE OR REPLACE FUNCTION runrow._agent_run_settings() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
DECLARE
    broken text;
BEGIN
    -- Each rule as the CHECK it replaces: NULL (an unknown) passes.
    broken := CASE
        WHEN (NEW.max_attempts >= 1 AND NEW.max_attempts <= 100) IS FALSE THEN 'agent_run_max_attempts_check'
        WHEN (NEW.model <> '') IS FALSE THEN 'agent_run_model_check'
        WHEN (NEW.idempotency_key <> '') IS FALSE THEN 'agent_run_idempotency_key_check'
        WHEN (jsonb_typeof(NEW.metadata) = 'object') IS FALSE THEN 'agent_run_metadata_check'
        WHEN (NEW.priority >= -1000 AND NEW.priority <= 1000) IS FALSE THEN 'agent_run_priority_range'
        WHEN (length(NEW.fairness_key) >= 1 AND length(NEW.fairness_key) <= 200) IS FALSE
            THEN 'agent_run_fairness_key_length'
        WHEN (length(NEW.concurrency_key) >= 1 AND length(NEW.concurrency_key) <= 200) IS FALSE
            THEN 'agent_run_concurrency_key_length'
        WHEN (length(NEW.rate_limit_key) >= 1 AND length(NEW.rate_limit_key) <= 200) IS FALSE
            THEN 'agent_run_rate_limit_key_length'
        WHEN (NEW.token_budget > 0) IS FALSE THEN 'agent_run_token_budget_positive'
        WHEN (NEW.cost_budget > 0) IS FALSE THEN 'agent_run_cost_budget_positive'
        WHEN (length(NEW.webhook_url) <= 2048 AND NEW.webhook_url ~ '^https?://[^[:space:]]+$') IS FALSE
            THEN 'agent_run_webhook_url_http'
        WHEN ((NEW.forked_from IS NULL) = (NEW.forked_at_seq IS NULL)) IS FALSE THEN 'agent_run_fork_names_its_step'
        WHEN (NEW.forked_at_seq >= 0) IS FALSE THEN 'agent_run_forked_at_seq_check'
    END;
    IF broken IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "agent_run" violates check constraint "%"', broken
            USING ERRCODE = 'check_violation', CONSTRAINT = broken, SCHEMA = 'runrow', TABLE = 'agent_run';
    END IF;
    RETURN NULL;
END
$fn$;

COMMENT ON FUNCTION runrow._agent_run_settings() IS
'agent_run''s AFTER INSERT OR UPDATE OF <the columns an enqueue sets> row trigger: the 13 rules '
'that were CHECK constraints until migration 0034 (max_attempts 1..100, model and idempotency_key '
'not empty, metadata an object, priority -1000..1000, fairness/concurrency/rate-limit keys 1..200 '
'characters, budgets positive, webhook_url an http(s) URL of at most 2048 characters, forked_from '
'and forked_at_seq set together, forked_at_seq >= 0), with CHECK''s meaning (NULL passes) and its '
'error: 23514 naming the rule as the constraint. Column-gated, so an UPDATE that assigns none of '
'those columns (every claim, heartbeat and finish) does not fire it. (A run''s references are '
'agent_run_owner_guard''s since 0052.)';

COMMENT ON FUNCTION runrow._prompt_immutable() IS
'prompt''s BEFORE UPDATE OR DELETE row trigger: a registered prompt never changes (23000: register '
'a new one) and is never deleted (23000), for every role, so a run''s prompt_id names a prompt for '
'as long as the run exists (checked once, at the run''s insert, by _run_owner_guard: 0050, 0052).';
