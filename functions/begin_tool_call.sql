CREATE OR REPLACE FUNCTION runrow.begin_tool_call(
    run_id uuid, claim_token uuid, idempotency_key text, tool text, args jsonb, effect text
)
RETURNS TABLE (state text, result jsonb)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    r runrow.agent_run;
    e runrow.tool_effect;
    found_call record;
BEGIN
    -- Each _require_* helper only raises, and a PERFORM is a statement: called only when the
    -- test before it fails, in the arguments' order, so the first bad one is still named.
    IF begin_tool_call.run_id IS NULL OR begin_tool_call.claim_token IS NULL
       OR begin_tool_call.idempotency_key IS NULL THEN
        PERFORM runrow._require_not_null(begin_tool_call.run_id, 'run_id');
        PERFORM runrow._require_not_null(begin_tool_call.claim_token, 'claim_token');
        PERFORM runrow._require_not_null(begin_tool_call.idempotency_key, 'idempotency_key');
    END IF;
    IF NOT runrow._is_tool_call_key(begin_tool_call.idempotency_key) THEN
        RAISE EXCEPTION 'idempotency_key must be 64 lowercase hex characters, as runrow.tool_call_key returns'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF begin_tool_call.tool IS NULL THEN
        PERFORM runrow._require_not_null(begin_tool_call.tool, 'tool');
    END IF;
    IF begin_tool_call.tool = '' OR length(begin_tool_call.tool) > 200 THEN
        RAISE EXCEPTION 'tool must be a tool name of 1 to 200 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Shown to the person approving it and in the journal: no control character.
    IF NOT runrow._printable(begin_tool_call.tool) THEN
        PERFORM runrow._require_printable(begin_tool_call.tool, 'tool');
    END IF;
    IF begin_tool_call.args IS NULL THEN
        PERFORM runrow._require_not_null(begin_tool_call.args, 'args');
    END IF;
    IF jsonb_typeof(begin_tool_call.args) <> 'object' THEN
        RAISE EXCEPTION 'args must be a JSON object (the tool_use block''s input), got %', jsonb_typeof(begin_tool_call.args)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF begin_tool_call.effect IS NULL THEN
        PERFORM runrow._require_not_null(begin_tool_call.effect, 'effect');
    END IF;
    IF begin_tool_call.effect NOT IN ('pure', 'idempotent', 'non_idempotent', 'irreversible') THEN
        -- Quoted below: a control character would reach the log through the error.
        PERFORM runrow._require_printable(begin_tool_call.effect, 'effect');
        RAISE EXCEPTION 'effect must be one of pure, idempotent, non_idempotent, irreversible, got "%"',
            left(begin_tool_call.effect, 80)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The fence. FOR UPDATE: this call may park the run. Lock order everywhere: the run,
    -- then its effect.
    SELECT a.* INTO r FROM runrow.agent_run AS a
    -- By primary key and token only, as heartbeat (a token means running: agent_run_state).
    WHERE a.id = begin_tool_call.run_id
      AND a.claim_token = begin_tool_call.claim_token
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    SELECT t.* INTO e FROM runrow.tool_effect AS t
    WHERE t.idempotency_key = begin_tool_call.idempotency_key
    FOR UPDATE;

    IF NOT FOUND THEN
        -- A stop was requested while the worker went on to this call: nothing that touches the
        -- world once only starts now (an irreversible call is not even offered to a person,
        -- _park_for_person). The run ends cancelled; no row, so the worker stops as if fenced.
        IF r.cancel_requested AND begin_tool_call.effect = 'non_idempotent' THEN
            PERFORM runrow._end_stopped(r.id, 'stopped before the tool call started');
            RETURN;
        END IF;
        -- A first begin: the key must be the one tool_call_key derives for an unanswered
        -- tool_use block of the run's latest model turn, so client and database agree on
        -- it and the call is tied to its block.
        SELECT s.seq, b.block ->> 'id' AS tool_use_id INTO found_call
        FROM (
            SELECT m.seq, m.payload FROM runrow.agent_step AS m
            WHERE m.run_id = r.id AND m.kind = 'model_turn'
            ORDER BY m.seq DESC
            LIMIT 1
        ) AS s
        -- Probed: the JSON operators raise on a \u0000 anywhere in the turn (its text may hold one).
        CROSS JOIN LATERAL json_array_elements(runrow._json_probe(s.payload)) AS b (block)
        WHERE b.block ->> 'type' = 'tool_use'
          AND b.block ->> 'name' = begin_tool_call.tool
          AND (b.block -> 'input')::jsonb = begin_tool_call.args
          AND runrow.tool_call_key(r.id, s.seq, b.block ->> 'id', begin_tool_call.tool, begin_tool_call.args)
              = begin_tool_call.idempotency_key
          -- A scalar probe, not NOT EXISTS: as an anti join the planner matched the id in a join
          -- filter over every tool_result of the run (a tool-heavy run paid quadratically).
          AND (
              SELECT 1 FROM runrow.agent_step AS x
              WHERE x.run_id = r.id AND x.kind = 'tool_result' AND x.tool_use_id = b.block ->> 'id'
              LIMIT 1
          ) IS NULL
          -- Only a tool the run was enqueued with runs: a model may name any tool, and a worker's
          -- registry may hold tools this run was never given. Here, not in each worker, so no
          -- client of any language can run one.
          AND EXISTS (
              SELECT 1 FROM runrow.prompt AS p
              WHERE p.id = r.prompt_id
                AND p.tools @> jsonb_build_array(jsonb_build_object('name', begin_tool_call.tool)));
        IF NOT FOUND THEN
            -- Told apart only on the way out, so a valid call runs no statement more.
            IF NOT EXISTS (
                SELECT 1 FROM runrow.prompt AS p
                WHERE p.id = r.prompt_id
                  AND p.tools @> jsonb_build_array(jsonb_build_object('name', begin_tool_call.tool))
            ) THEN
                RAISE EXCEPTION 'tool "%" is not among the tools the run was enqueued with: only an offered tool runs',
                    left(begin_tool_call.tool, 200)
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'Answer the tool_use with append_step(kind => ''tool_result'') and is_error, '
                                 'without calling the tool.';
            END IF;
            RAISE EXCEPTION 'idempotency_key matches no unanswered tool_use of the run''s latest model turn with this '
                'tool and args: it must be runrow.tool_call_key(run_id, step_seq, tool_use_id, tool, args)'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;

        INSERT INTO runrow.tool_effect AS t (
            idempotency_key, run_id, step_seq, tool_use_id, tool, args, effect, state, attempt,
            started_attempt, started_at
        )
        VALUES (
            begin_tool_call.idempotency_key, r.id, found_call.seq, found_call.tool_use_id, begin_tool_call.tool,
            begin_tool_call.args, begin_tool_call.effect,
            CASE WHEN begin_tool_call.effect = 'irreversible' THEN 'needs_approval' ELSE 'executing' END,
            r.attempt,
            CASE WHEN begin_tool_call.effect <> 'irreversible' THEN r.attempt END,
            CASE WHEN begin_tool_call.effect <> 'irreversible' THEN now() END
        );
        IF begin_tool_call.effect = 'irreversible' THEN
            PERFORM runrow._park_for_person(r.id, begin_tool_call.idempotency_key);
            state := 'needs_approval';
            result := NULL;
            RETURN NEXT;
        ELSE
            state := 'execute';
            result := NULL;
            RETURN NEXT;
        END IF;
        RETURN;
    END IF;

    IF e.run_id <> r.id OR e.tool <> begin_tool_call.tool OR e.args <> begin_tool_call.args
       OR e.effect <> begin_tool_call.effect THEN
        RAISE EXCEPTION 'idempotency_key was recorded for another run, tool, args or effect'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    CASE e.state
        WHEN 'done' THEN
            state := 'done';
            result := e.result;
            RETURN NEXT;
        WHEN 'executing' THEN
            IF r.cancel_requested AND e.effect = 'non_idempotent' THEN
                -- Not again after a stop (it may have happened on an earlier attempt: it stays
                -- executing, for open_tool_effects to show).
                PERFORM runrow._end_stopped(r.id, 'stopped before the tool call started again');
                RETURN;
            END IF;
            IF e.effect = 'irreversible' THEN
                -- Begun before and no result: it may have happened. Never again without a person.
                UPDATE runrow.tool_effect AS t SET state = 'uncertain'
                WHERE t.idempotency_key = e.idempotency_key;
                PERFORM runrow._park_for_person(r.id, e.idempotency_key);
                state := 'uncertain';
                result := NULL;
                RETURN NEXT;
            ELSE
                -- Safe to run again: the tool passes the same key downstream.
                UPDATE runrow.tool_effect AS t SET started_attempt = r.attempt, started_at = now()
                WHERE t.idempotency_key = e.idempotency_key;
                state := 'execute';
                result := NULL;
                RETURN NEXT;
            END IF;
        WHEN 'approved' THEN
            -- A person said yes, then the user pressed stop: the stop wins, the call never runs
            -- (it stays approved, unused). The run ends cancelled; no row: the worker stops.
            IF r.cancel_requested THEN
                PERFORM runrow._end_stopped(r.id, 'stopped before the approved tool call started');
                RETURN;
            END IF;
            -- Recorded before the worker runs it, so a crash from here on reads as uncertain.
            UPDATE runrow.tool_effect AS t SET state = 'executing', started_attempt = r.attempt, started_at = now()
            WHERE t.idempotency_key = e.idempotency_key;
            state := 'approved';
            result := runrow._decision(e);
            RETURN NEXT;
        WHEN 'rejected' THEN
            state := 'rejected';
            result := runrow._decision(e);
            RETURN NEXT;
        ELSE
            -- needs_approval or uncertain: still undecided (only a decision requeues a
            -- parked run, so this is a run put back by other means). Park it again.
            PERFORM runrow._park_for_person(r.id, e.idempotency_key);
            state := e.state;
            result := NULL;
            RETURN NEXT;
    END CASE;
END
$fn$;

COMMENT ON FUNCTION runrow.begin_tool_call(uuid, uuid, text, text, jsonb, text) IS
'Call before running a tool; returns one row (state, result). idempotency_key must be '
'runrow.tool_call_key(run_id, step_seq, tool_use_id, tool, args) of an unanswered tool_use in '
'the run''s latest model turn (22023 otherwise, and when a known key comes with another run, '
'tool, args or effect); tool must be one of the tools the run was enqueued with (22023 '
'otherwise: answer that tool_use with an is_error tool_result, never run it). effect pure, idempotent, non_idempotent: execute (run it; a '
'non_idempotent tool passes the key downstream; a resumed attempt gets execute again with the '
'same key) or done (the result is recorded: use result, do not run it). irreversible: the first '
'call records the intent and returns needs_approval, parking the run as waiting (claim '
'cleared, so heartbeat says owned = false; the attempt is handed back; approval_requested '
'journaled; a run whose stop was requested ends cancelled instead): the worker stops. After resolve_approval requeues it and a worker claims it: '
'approved (run it now; result = the decision; the start is recorded first, so a crash before '
'complete_tool_call makes the next begin return uncertain and park the run again for a '
'person) or rejected (result = {approved, decided_by, note, decided_at}: report the rejection '
'to the model with complete_tool_call(is_error => true)). uncertain: an irreversible call begun, '
'no result, begun again, or a non_idempotent or irreversible call a worker cut short '
'(interrupt_tool_call): parked for a person, never run again without one. A stop requested '
'before a non_idempotent call starts (first or again) or an approved call runs ends the run '
'cancelled instead, and no row comes back: the worker stops. Fenced: no row, '
'nothing written, unless claim_token matches a '
'running run.';

REVOKE ALL ON FUNCTION runrow.begin_tool_call(uuid, uuid, text, text, jsonb, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.begin_tool_call(uuid, uuid, text, text, jsonb, text) TO runrow_worker;
