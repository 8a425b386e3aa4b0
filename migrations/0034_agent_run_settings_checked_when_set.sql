-- depends: 0033_agent_run_guard_by_column
-- The rules on what an enqueue sets (attempts, model, idempotency key, metadata, priority and
-- the fleet columns of 0013/0017/0019) checked when those columns are written, not on every
-- UPDATE of a run (issue 11: the fixed cost of a one-run claim, finish or heartbeat).
--
-- Why: PostgreSQL checks every CHECK constraint of a table on every UPDATE, whatever columns
-- it assigns, and compiles each one's expression (its stored node tree read back, planned,
-- prepared) once per statement. agent_run's 13 CHECKs on columns only an enqueue (or a fork,
-- or a retry) sets cost about 35 us of every one-row UPDATE (measured: 125 -> 91 us per
-- one-row update without them; one CHECK with the 13 rules ANDed costs the same as 13). No
-- claim, heartbeat or finish assigns one of those columns.
--
-- Now one trigger, agent_run_settings, AFTER INSERT OR UPDATE OF exactly those columns: an
-- INSERT always fires it, an UPDATE only when it assigns one of them. Its function tests the
-- same 13 rules, with CHECK's meaning (NULL passes), and fails the statement with the same
-- error a CHECK would give: 23514, 'new row for relation "agent_run" violates check constraint
-- "<the same name>"', the constraint name in the error's fields. The six CHECKs on the
-- lifecycle columns stay CHECKs: every claim and finish assigns those columns anyway.
--
-- Measured (a PL/pgSQL loop of one-row updates; a one-session drain): see the commit message.

ALTER TABLE runrow.agent_run
DROP CONSTRAINT agent_run_max_attempts_check,
DROP CONSTRAINT agent_run_model_check,
DROP CONSTRAINT agent_run_idempotency_key_check,
DROP CONSTRAINT agent_run_metadata_check,
DROP CONSTRAINT agent_run_priority_range,
DROP CONSTRAINT agent_run_fairness_key_length,
DROP CONSTRAINT agent_run_concurrency_key_length,
DROP CONSTRAINT agent_run_rate_limit_key_length,
DROP CONSTRAINT agent_run_token_budget_positive,
DROP CONSTRAINT agent_run_cost_budget_positive,
DROP CONSTRAINT agent_run_webhook_url_http,
DROP CONSTRAINT agent_run_fork_names_its_step,
DROP CONSTRAINT agent_run_forked_at_seq_check;

CREATE FUNCTION runrow._agent_run_settings() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
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

REVOKE ALL ON FUNCTION runrow._agent_run_settings() FROM PUBLIC;

COMMENT ON FUNCTION runrow._agent_run_settings() IS
'agent_run''s AFTER INSERT OR UPDATE OF <the columns an enqueue sets> row trigger: the 13 rules '
'that were CHECK constraints until migration 0034 (max_attempts 1..100, model and idempotency_key '
'not empty, metadata an object, priority -1000..1000, fairness/concurrency/rate-limit keys 1..200 '
'characters, budgets positive, webhook_url an http(s) URL of at most 2048 characters, forked_from '
'and forked_at_seq set together, forked_at_seq >= 0), with CHECK''s meaning (NULL passes) and its '
'error: 23514 naming the rule as the constraint. Column-gated, so an UPDATE that assigns none of '
'those columns (every claim, heartbeat and finish) does not fire it.';

CREATE TRIGGER agent_run_settings
AFTER INSERT OR UPDATE OF
max_attempts, model, idempotency_key, metadata, priority, fairness_key, concurrency_key, rate_limit_key,
token_budget, cost_budget, webhook_url, forked_from, forked_at_seq
ON runrow.agent_run
FOR EACH ROW EXECUTE FUNCTION runrow._agent_run_settings();
