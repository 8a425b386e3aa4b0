-- agent_run's settings trigger function: the rules on the columns only an enqueue sets (migration
-- 0034 made them a trigger gated on those columns, so a claim, heartbeat or finish does not
-- compile them). It lived in migrations until 0065, restated whole by each one that changed a
-- rule (0034, 0035, 0041, 0050, 0052, 0065). Here it is re-applied by every migrate, like the
-- API: a rule changes in this one place, and no migration restates it again. Its trigger, and
-- the column list that gates it, stay in the migrations (DDL history).
--
-- The rules are CHECKs in meaning: NULL (an unknown) passes, and a broken one raises 23514 naming
-- the rule as the constraint, as a CHECK would. No SET clause (a settings save and restore on
-- every row, 0041); every runrow name is qualified, so the rules hold under any search_path
-- (pgtap/trigger_functions.sql).

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
        -- Finite too (0065): NaN sorts above every number, so NaN > 0 held.
        WHEN (NEW.cost_budget > 0 AND NEW.cost_budget < 'Infinity') IS FALSE THEN 'agent_run_cost_budget_positive'
        -- enqueue_run's rule: a host, and a port 1..65535 if it names one (until issue 11's stop 52,
        -- any http(s):// text without white space).
        WHEN runrow._webhook_url_ok(NEW.webhook_url) IS FALSE THEN 'agent_run_webhook_url_http'
        -- The identifiers operators read back hold no control character (0085, _printable). A
        -- new run's are tested here too although enqueue_run tested them (for its 22023 naming
        -- the argument): this is the schema's guarantee, whoever writes the row (about 1 us an
        -- enqueue).
        WHEN (runrow._printable(NEW.model) AND runrow._printable(NEW.user_id)
              AND runrow._printable(NEW.idempotency_key) AND runrow._printable(NEW.fairness_key)
              AND runrow._printable(NEW.concurrency_key) AND runrow._printable(NEW.rate_limit_key)
              AND runrow._printable(NEW.webhook_url)) IS FALSE THEN 'agent_run_identifiers_printable'
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
'agent_run''s AFTER INSERT OR UPDATE OF <the columns an enqueue sets> row trigger: the 14 rules '
'that were CHECK constraints until migration 0034 (max_attempts 1..100, model and idempotency_key '
'not empty, metadata an object, priority -1000..1000, fairness/concurrency/rate-limit keys 1..200 '
'characters, budgets positive and the cost budget finite (0065), webhook_url an http(s) URL of '
'at most 2048 characters with a host and a port 1..65535 if it names one (_webhook_url_ok), model, '
'user_id, idempotency_key, the three keys and webhook_url with no control character (0085, '
'_printable: agent_run_identifiers_printable; user_id joined the trigger''s columns), forked_from '
'and forked_at_seq set together, forked_at_seq >= 0), with CHECK''s meaning (NULL passes) and its '
'error: 23514 naming the rule as the constraint. Column-gated, so an UPDATE that assigns none of '
'those columns (every claim, heartbeat and finish) does not fire it. (A run''s references are '
'agent_run_owner_guard''s since 0052.)';
