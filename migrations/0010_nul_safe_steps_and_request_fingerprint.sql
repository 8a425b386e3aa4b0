-- Two things a caller could not do safely before:
--
-- 1. Store a step whose text holds U+0000. json (the step log's type) accepts the escape
--    \u0000 and keeps it verbatim, but every JSON operator that reads a field (->, ->>,
--    json_each, ...) de-escapes the strings it lexes and raises 22P05 on \u0000, anywhere in
--    the value. The derived column agent_step.tool_use_id was such an expression, so a
--    tool_result whose content held a NUL could not even be inserted. It becomes a plain
--    column that the insert trigger derives from runrow._json_probe(payload): the payload as
--    json with each \u0000 escape read as \ufffd, so the operators work; the stored payload
--    is never changed. The table stays append-only, so a value derived at insert cannot drift
--    from its payload (the guarantee the generated column gave).
--
-- 2. Tell a reused enqueue idempotency key from a retried request. agent_run gets the
--    fingerprint of the request that created the run (enqueue_run computes it when a key is
--    given: SHA-256 of the canonical jsonb text of conversation, user, content, model, system
--    prompt, tools, max_attempts, if_active and metadata). A replay with the same fingerprint
--    returns the first run; any other request with that key is refused. Runs enqueued before
--    this migration have no fingerprint and replay as before.
-- depends: 0009_open_runs_by_conversation

-- A json value the JSON operators can read: each \u0000 escape becomes \ufffd. Escaped
-- backslash pairs are set aside first (chr(1) cannot occur in valid json text: control
-- characters must be escaped inside strings and are not whitespace outside them), so the
-- replace sees only real escapes, exactly as a left-to-right JSON lexer would.
CREATE FUNCTION runrow._json_probe(payload json)
RETURNS json
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
SET search_path = pg_catalog, runrow
AS $fn$
    SELECT CASE
        WHEN strpos(_json_probe.payload::text, '\u0000') = 0 THEN _json_probe.payload
        ELSE replace(replace(replace(_json_probe.payload::text, '\\', chr(1)), '\u0000', '\ufffd'), chr(1), '\\')::json
    END;
$fn$;

COMMENT ON FUNCTION runrow._json_probe(json) IS
'Private. payload with each \u0000 escape read as \ufffd, for the checks and derived values '
'that need JSON operators (which raise 22P05 on \u0000). The stored payload is never changed.';

REVOKE ALL ON FUNCTION runrow._json_probe(json) FROM PUBLIC;

ALTER TABLE runrow.agent_step ALTER COLUMN tool_use_id DROP EXPRESSION;

COMMENT ON COLUMN runrow.agent_step.tool_use_id IS
'The tool_use a tool_result answers, derived from the payload by the insert trigger (a NUL in '
'it reads as U+FFFD); NULL for a model_turn. Keeps "one result per tool_use" in the schema.';

CREATE OR REPLACE FUNCTION runrow._agent_step_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, runrow
AS $fn$
DECLARE
    expected integer;
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- Invariant 4: the next seq, no gap, no reuse.
        SELECT coalesce(max(s.seq), 0) + 1 INTO expected
        FROM runrow.agent_step AS s WHERE s.run_id = NEW.run_id;
        IF NEW.seq <> expected THEN
            RAISE EXCEPTION 'agent_step seq % for run % is out of order: expected %', NEW.seq, NEW.run_id, expected
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        -- Derived, whatever the INSERT said, so it cannot disagree with the payload.
        NEW.tool_use_id := CASE
            WHEN NEW.kind = 'tool_result' THEN runrow._json_probe(NEW.payload) ->> 'tool_use_id'
        END;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'agent_step is append-only: rows cannot be %d', lower(TG_OP)
        USING ERRCODE = 'integrity_constraint_violation',
              HINT = 'Steps are the record of a run; a correction is a new step.';
END
$fn$;

-- Adding a nullable column without a default is a catalog change: no rewrite, no scan.
ALTER TABLE runrow.agent_run ADD COLUMN request_fingerprint text;

COMMENT ON COLUMN runrow.agent_run.request_fingerprint IS
'Hex SHA-256 of the enqueue request that created the run (see enqueue_run), kept when it came '
'with an idempotency_key: a replay of that key must match it. NULL without a key, for '
'retry_run''s runs and for runs enqueued before migration 0010.';
