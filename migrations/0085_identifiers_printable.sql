-- depends: 0084_block_told_until
-- Identifiers hold no control character (functions/_identifier_checks.sql: C0, DEL and C1
-- controls, bidirectional formatting). A fairness_key of "acme\n2026-12-07 ERROR ..." forged a log
-- line, a right-to-left override showed `runrow status` another tenant. The API refuses them
-- where they are named (22023); here the tables that keep them refuse them too, each in the way
-- its writes allow:
--
-- - agent_run (model, user_id, idempotency_key, the three keys, webhook_url): a rule of its
--   settings trigger (functions/_agent_run_settings.sql), not a CHECK. A CHECK of agent_run is
--   compiled and evaluated on every UPDATE, claims and heartbeats included (why 0034 made the
--   settings a trigger), and a NOT VALID one still refuses an UPDATE of an old row that breaks
--   it: one queued run stored before with such a key would fail every claim that met it. The
--   trigger fires when those columns are written, and now on user_id too.
-- - schedule (model, user_id, fairness_key, concurrency_key): a trigger gated on those columns,
--   as schedule_name_printable (0081) is on name, for 0081's reason: a firing pass updates every
--   due schedule's next_fire_at, and a CHECK would make one old schedule stop every pass. Its name
--   keeps that trigger, whose test (_schedule_name_ok) now refuses the bidirectional controls too.
-- - model_price, concurrency_limit, tenant_budget: the same trigger, gated on the identifier's
--   column, not a CHECK. A CHECK, even NOT VALID, is evaluated on every UPDATE of the row, and
--   the claim's trigger (_agent_run_after_update) stamps concurrency_limit.last_claimed_at at
--   every start of a capped run: one limit stored before this migration with such a key made
--   every claim that met it fail its check, caught by _claim as "nothing claimed" (the review).
--   A row stored before stays, is updated and can be removed.
-- Not constrained, being copies of the above: agent_run.worker_id and webhook_delivery.worker_id
-- (the claims' argument, checked once per call; a CHECK would be evaluated on every claim),
-- conversation.user_id (its run's, in the same transaction), rate_limit.rate_limit_key (a key
-- set_rate_limit checks or a run's: report_rate_limited inserts an old run's key, which must not
-- fail), fairness_tenant and spend_hour (a run's keys and model), tool_effect.tool and decided_by
-- (begin_tool_call's and resolve_approval's arguments; tool_effect's rules are one CHECK
-- evaluated on every update of a call).

DROP TRIGGER agent_run_settings ON runrow.agent_run;
CREATE TRIGGER agent_run_settings
AFTER INSERT OR UPDATE OF
max_attempts, model, idempotency_key, metadata, priority, fairness_key, concurrency_key, rate_limit_key,
token_budget, cost_budget, webhook_url, forked_from, forked_at_seq, user_id
ON runrow.agent_run
FOR EACH ROW EXECUTE FUNCTION runrow._agent_run_settings();

-- The test of the class, as functions/_identifier_checks.sql has it (functions/ owns it and
-- replaces this): the triggers below call it from their first row on, and between this
-- migration's commit and functions/ being applied a row written would otherwise fail with 42883.
CREATE OR REPLACE FUNCTION runrow._printable(value text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT value !~ E'[\u0001-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]'
$fn$;

-- The identifiers of schedule's template, model_price, concurrency_limit and tenant_budget. The
-- trigger's arguments name the columns, so that a column added later is one more argument.
-- Raises 23514 as a CHECK of the trigger's name would.
CREATE FUNCTION runrow._identifiers_printable() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
DECLARE
    doc jsonb := to_jsonb(NEW);
    col text;
BEGIN
    FOREACH col IN ARRAY TG_ARGV LOOP
        IF runrow._printable(doc ->> col) IS FALSE THEN
            RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', TG_TABLE_NAME, TG_NAME
                USING ERRCODE = 'check_violation', SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
                    CONSTRAINT = TG_NAME, COLUMN = col,
                    DETAIL = format('%s holds a control character (C0, C1 or bidirectional formatting)', col);
        END IF;
    END LOOP;
    RETURN NEW;
END
$fn$;

COMMENT ON FUNCTION runrow._identifiers_printable() IS
'BEFORE INSERT OR UPDATE OF <columns> row trigger (migration 0085): each column its arguments '
'name must hold no control character (_printable), else 23514 naming the trigger as the '
'constraint and the column. A row stored before is not checked again when other columns change.';

REVOKE ALL ON FUNCTION runrow._identifiers_printable() FROM PUBLIC;

CREATE TRIGGER schedule_identifiers_printable
BEFORE INSERT OR UPDATE OF model, user_id, fairness_key, concurrency_key ON runrow.schedule
FOR EACH ROW EXECUTE FUNCTION runrow._identifiers_printable('model', 'user_id', 'fairness_key', 'concurrency_key');

CREATE TRIGGER model_price_model_printable
BEFORE INSERT OR UPDATE OF model ON runrow.model_price
FOR EACH ROW EXECUTE FUNCTION runrow._identifiers_printable('model');

CREATE TRIGGER concurrency_limit_key_printable
BEFORE INSERT OR UPDATE OF concurrency_key ON runrow.concurrency_limit
FOR EACH ROW EXECUTE FUNCTION runrow._identifiers_printable('concurrency_key');

CREATE TRIGGER tenant_budget_key_printable
BEFORE INSERT OR UPDATE OF fairness_key ON runrow.tenant_budget
FOR EACH ROW EXECUTE FUNCTION runrow._identifiers_printable('fairness_key');
