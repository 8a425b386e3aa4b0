-- depends: 0049_agent_step_rules_validated
-- A run's prompt is checked by agent_run's insert trigger, not by a foreign key (issue 11: the
-- writes of an enqueue, and a hot row under a fleet's enqueues).
--
-- Why: the foreign key agent_run.prompt_id -> prompt.id checked every inserted run with a query
-- of its own (PostgreSQL's RI trigger) that key-share locked the prompt's row. A prompt is shared
-- by every run of an application, so every enqueue locked the same row: a WAL record and a dirtied
-- page each (Heap/LOCK, 54 B of an enqueue's 3.4 kB), and whenever two enqueues of one prompt
-- overlapped, a MultiXact for the row's lockers, one more for each enqueue that joined them. A
-- fleet enqueueing at a few thousand runs a second spends MultiXact ids and member space at that
-- rate, and their wraparound is an anti-wraparound vacuum's to prevent.
--
-- The check it made is one the run's insert trigger can make without a lock, as 0031 did for the
-- journal's reference to its run: a prompt is never deleted (prompt_immutable now refuses DELETE
-- too, prompt_no_truncate TRUNCATE, for every role) and never changed (its id included), and a
-- run's prompt_id never changes (agent_run_identity_guard), so a prompt that exists when the run
-- is inserted exists for as long as the run.
--
-- Unchanged: a run whose prompt does not exist is refused with 23503 (foreign_key_violation) and
-- the message and constraint name the foreign key gave. Deleting a prompt was refused with 23503
-- while a run referred to it; now any prompt's deletion is refused, with 23000.
--
-- Measured: see the commit message.

ALTER TABLE runrow.agent_run DROP CONSTRAINT agent_run_prompt_id_fkey;

CREATE OR REPLACE FUNCTION runrow._prompt_immutable() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'prompt % is never deleted: runs refer to it by its id', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RAISE EXCEPTION 'prompt % is immutable: register a new prompt instead', OLD.id
        USING ERRCODE = 'integrity_constraint_violation';
END
$fn$;

COMMENT ON FUNCTION runrow._prompt_immutable() IS
'prompt''s BEFORE UPDATE OR DELETE row trigger: a registered prompt never changes (23000: register '
'a new one) and is never deleted (23000), for every role, so a run''s prompt_id names a prompt for '
'as long as the run exists (checked once, at the run''s insert, by _agent_run_settings: 0050).';

DROP TRIGGER prompt_immutable ON runrow.prompt;
CREATE TRIGGER prompt_immutable BEFORE UPDATE OR DELETE ON runrow.prompt
FOR EACH ROW EXECUTE FUNCTION runrow._prompt_immutable();

CREATE TRIGGER prompt_no_truncate BEFORE TRUNCATE ON runrow.prompt
FOR EACH STATEMENT EXECUTE FUNCTION runrow._no_truncate();

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
    -- The run's prompt exists (0050; a foreign key until then), looked up without a lock: a
    -- prompt is never deleted or changed, and a run's prompt_id never changes.
    IF TG_OP = 'INSERT' AND NOT EXISTS (SELECT 1 FROM runrow.prompt AS p WHERE p.id = NEW.prompt_id) THEN
        RAISE EXCEPTION 'insert or update on table "agent_run" violates foreign key constraint "agent_run_prompt_id_fkey"'
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'agent_run_prompt_id_fkey', SCHEMA = 'runrow',
                  TABLE = 'agent_run',
                  DETAIL = format('Key (prompt_id)=(%s) is not present in table "prompt".', NEW.prompt_id);
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
'error: 23514 naming the rule as the constraint. On INSERT, also that the run''s prompt exists '
'(0050, the foreign key agent_run_prompt_id_fkey until then): 23503 with the foreign key''s message, '
'looked up without a row lock. Column-gated, so an UPDATE that assigns none of those columns '
'(every claim, heartbeat and finish) does not fire it.';
