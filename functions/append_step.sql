-- The form before migration 0108 goes: beside this one, a call with four to seven arguments
-- would be ambiguous (42725). Here rather than in 0108, as set_model_price's older forms.
DROP FUNCTION IF EXISTS runrow.append_step(uuid, uuid, text, json, text, jsonb, text);

CREATE OR REPLACE FUNCTION runrow.append_step(
    run_id uuid, claim_token uuid, kind text, payload json, request_id text DEFAULT NULL,
    usage jsonb DEFAULT NULL, stop_reason text DEFAULT NULL, stop_sequence text DEFAULT NULL,
    stop_details jsonb DEFAULT NULL
)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    last_turn record;
    bad record;
    answered text;
    probe json;
    seq integer;
BEGIN
    -- The helpers only raise: called only when a test here fails, not as a statement each on
    -- every step (see enqueue_run).
    IF append_step.run_id IS NULL OR append_step.claim_token IS NULL OR append_step.kind IS NULL THEN
        PERFORM runrow._require_not_null(append_step.run_id, 'run_id');
        PERFORM runrow._require_not_null(append_step.claim_token, 'claim_token');
        PERFORM runrow._require_not_null(append_step.kind, 'kind');
    END IF;
    IF append_step.kind NOT IN ('model_turn', 'tool_result') THEN
        -- Quoted below: a control character would reach the log through the error.
        PERFORM runrow._require_printable(append_step.kind, 'kind');
        RAISE EXCEPTION 'kind must be model_turn or tool_result, got "%"', left(append_step.kind, 80)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF append_step.payload IS NULL THEN
        PERFORM runrow._require_not_null(append_step.payload, 'payload');
    END IF;
    IF octet_length(append_step.payload::text) > 8388608 THEN
        RAISE EXCEPTION 'payload is too large: % bytes, the limit is 8 MiB', octet_length(append_step.payload::text)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- request_id and stop_reason are kept on the step and read back (support tickets, the
    -- history): no control character (functions/_identifier_checks.sql). A term of the test
    -- each already had, inlined: no statement more on a valid step.
    IF append_step.request_id = '' OR length(append_step.request_id) > 255
       OR NOT runrow._printable(append_step.request_id) THEN
        PERFORM runrow._require_printable(append_step.request_id, 'request_id');
        RAISE EXCEPTION 'request_id must be NULL or 1 to 255 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF append_step.usage IS NOT NULL AND jsonb_typeof(append_step.usage) <> 'object' THEN
        RAISE EXCEPTION 'usage must be NULL or a JSON object, got %', jsonb_typeof(append_step.usage)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The token counts the settlement and run_usage add up, when numbers: whole, within the
    -- settlement's clamp. 1e30 or -5 was stored, and run_usage then raised 22003 on every call
    -- for the run (issue 11's SQL audit). A count that is not a number counts 0 (another
    -- provider, an older SDK), and other fields are the provider's: both pass.
    IF append_step.usage IS NOT NULL AND jsonb_path_exists(append_step.usage,
        'strict $.keyvalue() ? ((@.key == "input_tokens" || @.key == "output_tokens"'
        ' || @.key == "cache_creation_input_tokens" || @.key == "cache_read_input_tokens")'
        ' && @.value.type() == "number" && (@.value < 0'
        ' || @.value > 1000000000000000 || @.value.floor() != @.value))') THEN
        SELECT k.field, append_step.usage -> k.field AS value INTO bad
        FROM unnest(ARRAY['input_tokens', 'output_tokens', 'cache_creation_input_tokens', 'cache_read_input_tokens'])
            AS k (field)
        WHERE jsonb_typeof(append_step.usage -> k.field) = 'number' AND NOT coalesce(
            (append_step.usage ->> k.field)::numeric BETWEEN 0 AND 1000000000000000
            AND (append_step.usage ->> k.field)::numeric = floor((append_step.usage ->> k.field)::numeric), false)
        LIMIT 1;
        RAISE EXCEPTION 'usage.% must be a whole number of tokens from 0 to 10^15, got %', bad.field, left(bad.value::text, 80)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF append_step.stop_reason = '' OR length(append_step.stop_reason) > 64
       OR NOT runrow._printable(append_step.stop_reason) THEN
        PERFORM runrow._require_printable(append_step.stop_reason, 'stop_reason');
        RAISE EXCEPTION 'stop_reason must be NULL or 1 to 64 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- How the turn ended beyond its stop_reason (0108), kept for a resumed attempt or a fork
    -- ending on it. The sequence is the run's own request's (newlines and all): no _printable.
    -- One test of two NULLs on a step without them (its kind's rule too).
    IF append_step.stop_sequence IS NOT NULL OR append_step.stop_details IS NOT NULL THEN
        IF append_step.kind <> 'model_turn' THEN
            RAISE EXCEPTION 'usage, stop_reason, stop_sequence and stop_details belong to a model_turn, not a %',
                append_step.kind
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF append_step.stop_sequence = '' OR length(append_step.stop_sequence) > 4096 THEN
            RAISE EXCEPTION 'stop_sequence must be NULL or 1 to 4096 characters'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF jsonb_typeof(append_step.stop_details) <> 'object' THEN
            RAISE EXCEPTION 'stop_details must be NULL or a JSON object, got %', jsonb_typeof(append_step.stop_details)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF octet_length(append_step.stop_details::text) > 65536 THEN
            RAISE EXCEPTION 'stop_details is too large: % bytes, the limit is 64 KiB',
                octet_length(append_step.stop_details::text)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    IF append_step.kind <> 'model_turn' AND (append_step.usage IS NOT NULL OR append_step.stop_reason IS NOT NULL) THEN
        RAISE EXCEPTION 'usage, stop_reason, stop_sequence and stop_details belong to a model_turn, not a %',
            append_step.kind
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The shape checks read probe, the payload with each \u0000 escape read as \ufffd: the
    -- JSON operators raise 22P05 on \u0000 anywhere in the value, and text may hold a NUL.
    -- The payload itself is stored as given.
    probe := runrow._json_probe(append_step.payload);
    IF append_step.kind = 'model_turn' THEN
        IF json_typeof(probe) <> 'array' OR json_array_length(probe) = 0 THEN
            RAISE EXCEPTION 'payload of a model_turn must be the non-empty array of the assistant message''s content blocks'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT b.ord INTO bad
        FROM json_array_elements(probe) WITH ORDINALITY AS b (block, ord)
        WHERE json_typeof(b.block) <> 'object'
           OR json_typeof(b.block -> 'type') IS DISTINCT FROM 'string'
           OR b.block ->> 'type' = ''
           OR (b.block ->> 'type' = 'tool_use' AND (
                json_typeof(b.block -> 'id') IS DISTINCT FROM 'string' OR b.block ->> 'id' = ''
                OR json_typeof(b.block -> 'name') IS DISTINCT FROM 'string'
                OR json_typeof(b.block -> 'input') IS DISTINCT FROM 'object'))
        ORDER BY b.ord
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'payload[%] must be a content block object with a string "type" (a tool_use also needs '
                'a string "id", a string "name" and an object "input")', bad.ord - 1
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- What a tool_use's later calls need (issue 11's SQL audit: each was accepted here and
        -- made every later call for the turn fail): an id tool_effect's index can hold (rule 1),
        -- an id of its own in the turn (2: a second "dup" raised 23505 at its begin_tool_call),
        -- input that tool_call_key's canonical form can walk (3: its recursion hit the stack
        -- limit, 54001, near 600 levels), and an id with no control character (4: it becomes
        -- tool_effect's and the tool_result's tool_use_id, read back by operators and quoted in
        -- errors; tested before rule 2, whose message quotes it). A statement of its
        -- own, run only when the payload's text names a tool_use or holds a \u escape, which
        -- could spell one (tool\u005fuse): simple expressions, so a turn of plain text pays
        -- nothing for it.
        IF strpos(probe::text, 'tool_use') > 0 OR strpos(probe::text, '\u') > 0 THEN
            SELECT v.ord, v.rule, v.id, v.first INTO bad
            FROM (
                SELECT d.ord, d.id, d.first, CASE
                           WHEN length(d.id) > 256 THEN 1
                           WHEN NOT runrow._printable(d.id) THEN 4
                           WHEN d.first < d.ord THEN 2
                           WHEN runrow._json_too_deep(d.input::jsonb) THEN 3
                       END AS rule
                FROM (
                    SELECT x.ord, x.block ->> 'id' AS id, x.block -> 'input' AS input,
                           min(x.ord) OVER (PARTITION BY x.block ->> 'id') AS first
                    FROM json_array_elements(probe) WITH ORDINALITY AS x (block, ord)
                    WHERE x.block ->> 'type' = 'tool_use'
                ) AS d
            ) AS v
            WHERE v.rule IS NOT NULL
            ORDER BY v.ord
            LIMIT 1;
            IF FOUND THEN
                IF bad.rule = 4 THEN
                    PERFORM runrow._require_printable(bad.id, format('payload[%s].id', bad.ord - 1));
                END IF;
                RAISE EXCEPTION 'payload[%]%', bad.ord - 1, CASE bad.rule
                    WHEN 1 THEN format('.id is %s characters: a tool_use id is at most 256', length(bad.id))
                    WHEN 2 THEN format('.id "%s" is already payload[%s]: each tool_use of a turn has an id of its own',
                        left(bad.id, 80), bad.first - 1)
                    ELSE '.input nests 100 levels deep or more: JSON clients cannot read it back (at most 99)'
                END
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
        END IF;
    ELSE
        IF json_typeof(probe) <> 'object'
           OR json_typeof(probe -> 'type') IS DISTINCT FROM 'string'
           OR probe ->> 'type' <> 'tool_result'
           OR json_typeof(probe -> 'tool_use_id') IS DISTINCT FROM 'string'
           OR probe ->> 'tool_use_id' = ''
           -- Kept as the step's tool_use_id and quoted in the errors below: no control character.
           OR NOT runrow._printable(probe ->> 'tool_use_id') THEN
            PERFORM runrow._require_printable(probe ->> 'tool_use_id', 'payload.tool_use_id');
            RAISE EXCEPTION 'payload of a tool_result must be one {"type": "tool_result", "tool_use_id": ...} block'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;

    -- The fence (fenced out: nothing written, NULL returned).
    IF NOT runrow._hold_claim(append_step.run_id, append_step.claim_token) THEN
        RETURN NULL;
    END IF;

    -- The step log is always a valid conversation: a tool_result answers an unanswered
    -- tool_use of the latest model turn, and a new model turn comes only once every
    -- tool_use of the previous one has its result.
    SELECT s.seq, s.payload INTO last_turn
    FROM runrow.agent_step AS s
    WHERE s.run_id = append_step.run_id AND s.kind = 'model_turn'
    ORDER BY s.seq DESC
    LIMIT 1;

    IF append_step.kind = 'tool_result' THEN
        answered := probe ->> 'tool_use_id';
        IF last_turn.seq IS NULL OR NOT EXISTS (
            SELECT 1 FROM json_array_elements(runrow._json_probe(last_turn.payload)) AS b (block)
            WHERE b.block ->> 'type' = 'tool_use' AND b.block ->> 'id' = answered
        ) THEN
            RAISE EXCEPTION 'payload: tool_use_id "%" is not a tool_use of the run''s latest model turn', answered
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF EXISTS (
            SELECT 1 FROM runrow.agent_step AS s
            WHERE s.run_id = append_step.run_id AND s.kind = 'tool_result' AND s.tool_use_id = answered
        ) THEN
            RAISE EXCEPTION 'payload: tool_use "%" already has its tool_result', answered
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        IF EXISTS (
            SELECT 1 FROM runrow.tool_effect AS t
            WHERE t.run_id = append_step.run_id AND t.tool_use_id = answered
        ) THEN
            RAISE EXCEPTION 'payload: tool_use "%" was begun with begin_tool_call; record its result with complete_tool_call',
                answered
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
    ELSIF last_turn.seq IS NOT NULL THEN
        SELECT b.block ->> 'id' AS id INTO bad
        FROM json_array_elements(runrow._json_probe(last_turn.payload)) AS b (block)
        WHERE b.block ->> 'type' = 'tool_use'
          -- A scalar probe, not NOT EXISTS: as an anti join the planner matched the id in a join
          -- filter over every tool_result of the run (a tool-heavy run paid quadratically).
          AND (
              SELECT 1 FROM runrow.agent_step AS s
              WHERE s.run_id = append_step.run_id AND s.kind = 'tool_result'
                AND s.tool_use_id = b.block ->> 'id'
              LIMIT 1
          ) IS NULL
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'kind: a new model_turn needs a tool_result for every tool_use of step % first; "%" has none',
                last_turn.seq, bad.id
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
    END IF;

    seq := runrow._append_step(
        append_step.run_id, append_step.kind, append_step.payload, append_step.request_id,
        append_step.usage, append_step.stop_reason);
    -- A side row only for a turn with an ending to keep (0108): an append without one costs
    -- this NULL test and nothing more. (0108 chose a side table because a column on agent_step
    -- measured ~45 % dearer; that was the guard's max(seq) plan flipping, fixed by 0112.)
    IF append_step.stop_sequence IS NOT NULL OR append_step.stop_details IS NOT NULL THEN
        INSERT INTO runrow.agent_step_ending (run_id, seq, stop_sequence, stop_details)
        VALUES (append_step.run_id, seq, append_step.stop_sequence, append_step.stop_details);
    END IF;
    -- The usage settles the rate-limit buckets and the budgets in the step's own transaction,
    -- so a crossed budget is decided with the step that crossed it.
    IF append_step.usage IS NOT NULL THEN
        PERFORM runrow._settle_usage(append_step.run_id, append_step.usage);
    END IF;
    RETURN seq;
END
$fn$;

COMMENT ON FUNCTION runrow.append_step(uuid, uuid, text, json, text, jsonb, text, text, jsonb) IS
'Append one step to the run''s durable step log at the next seq and return that seq. kind '
'model_turn: payload is the assistant message''s content array exactly as the SDK produced it '
'(thinking and redacted_thinking blocks with their signatures included), with its usage '
'object, stop_reason, and (when given) stop_sequence, the one of the run''s stop_sequences the '
'model met, and stop_details, a refusal''s details (get_step reads them back and fork_run copies '
'them: a resumed attempt or a fork ending on the turn reports them; steps before migration 0108 '
'have none); kind tool_result: one '
'tool_result block, for a tool_use of the latest model turn that has no result yet and was not '
'begun with begin_tool_call (those get theirs from complete_tool_call). A model_turn is '
'refused (55000) while a tool_use of the previous one has no result, so the log is always a '
'valid conversation. payload is json, stored verbatim: the same bytes come back from '
'conversation_history, the escape \u0000 (a NUL in the text) included. request_id (the '
'provider''s) is kept for support tickets. A model_turn''s usage settles the run''s '
'rate-limit buckets and budgets (spent_tokens, spent_cost, spend_hour; a crossed budget marks '
'the run, and its next acquire_model_call ends it budget_exhausted). At most 8 MiB. Fenced: NULL, nothing written, '
'unless claim_token matches a running run. Bad input raises 22004/22023 naming the argument '
'(a model_turn''s tool_use ids are at most 256 characters and distinct within the turn, their '
'input nests fewer than 100 levels; usage''s four token counts, when numbers, are whole and 0 to '
'10^15; stop_sequence 1 to 4096 characters; stop_details a JSON object of at most 64 KiB; '
'usage, stop_reason, stop_sequence and stop_details only on a model_turn). request_id, stop_reason, a tool_use''s id and a tool_result''s tool_use_id holding a control '
'character (C0, C1 or bidirectional formatting: _printable) raise 22023 naming it '
'(payload[i].id, payload.tool_use_id).';

REVOKE ALL ON FUNCTION runrow.append_step(uuid, uuid, text, json, text, jsonb, text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.append_step(uuid, uuid, text, json, text, jsonb, text, text, jsonb) TO runrow_worker;
