CREATE OR REPLACE FUNCTION runrow.fork_run(run_id uuid, at_seq integer, model text DEFAULT NULL)
RETURNS TABLE (new_run_id uuid, new_conversation_id uuid, steps_copied integer, must_drop jsonb)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    src runrow.agent_run;
    last_seq integer;
    new_conversation uuid := gen_random_uuid();
    fork_model text;
    turn record;
    copy_message uuid;
    copy_run uuid;
    copied integer := 0;
    n integer;
    drops jsonb := '[]';
BEGIN
    PERFORM runrow._require_not_null(fork_run.run_id, 'run_id');
    PERFORM runrow._require_not_null(fork_run.at_seq, 'at_seq');
    IF fork_run.model = '' OR length(fork_run.model) > 200 THEN
        RAISE EXCEPTION 'model must be NULL or a model name of 1 to 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT runrow._model_trimmed(fork_run.model) THEN
        PERFORM runrow._require_model_trimmed(fork_run.model);
    END IF;
    PERFORM runrow._require_printable(fork_run.model, 'model');
    SELECT a.* INTO src FROM runrow.agent_run AS a WHERE a.id = fork_run.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run_id % does not exist', fork_run.run_id USING ERRCODE = 'no_data_found';
    END IF;
    -- Steps are append-only, so steps 1..at_seq are final even while the run still runs: a
    -- fork of a live run needs no lock on it and never sees what the run writes later.
    -- The key's last entry, not max(seq): one plan whatever the statistics (as the step guard, 0112).
    SELECT s.seq INTO last_seq FROM runrow.agent_step AS s WHERE s.run_id = src.id ORDER BY s.seq DESC LIMIT 1;
    last_seq := coalesce(last_seq, 0);
    IF fork_run.at_seq < 0 OR fork_run.at_seq > last_seq THEN
        RAISE EXCEPTION 'at_seq must be between 0 and % (the steps run % has), got %',
            last_seq, src.id, fork_run.at_seq
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    fork_model := coalesce(fork_run.model, src.model);

    INSERT INTO runrow.conversation (id, user_id)
    SELECT new_conversation, c.user_id FROM runrow.conversation AS c WHERE c.id = src.conversation_id;

    -- The earlier turns that make up the source's history (conversation_history's rule: completed,
    -- or cancelled after the model acted, and not ended in a refusal) are copied as they ended,
    -- then the source itself up to at_seq as a queued run. Same order, same statuses, same bytes: conversation_history of the
    -- fork rebuilds exactly the source's model input, synthesized tool results included.
    -- The earlier turns have ended (agent_run_ended_by_conversation); the source is read by key.
    FOR turn IN
        SELECT a.* FROM runrow.agent_run AS a
        WHERE a.conversation_id = src.conversation_id
          AND a.enqueue_seq < src.enqueue_seq
          AND a.status IN ('completed', 'failed', 'cancelled', 'dead')
          AND (
              a.status = 'completed'
              OR (a.status = 'cancelled' AND EXISTS (SELECT 1 FROM runrow.agent_step AS s WHERE s.run_id = a.id))
          )
          AND (
              SELECT s.stop_reason FROM runrow.agent_step AS s
              WHERE s.run_id = a.id AND s.kind = 'model_turn'
              ORDER BY s.seq DESC
              LIMIT 1
          ) IS DISTINCT FROM 'refusal'
        UNION ALL
        SELECT a.* FROM runrow.agent_run AS a WHERE a.id = src.id
        ORDER BY enqueue_seq
    LOOP
        INSERT INTO runrow.message (conversation_id, user_id, content)
        SELECT new_conversation, m.user_id, m.content FROM runrow.message AS m WHERE m.id = turn.user_message_id
        RETURNING id INTO copy_message;

        n := CASE WHEN turn.id = src.id THEN fork_run.at_seq
                  ELSE (SELECT count(*)::integer FROM runrow.agent_step AS s WHERE s.run_id = turn.id) END;
        IF turn.id = src.id THEN
            -- With the source's fleet settings (without them the fork escaped its tenant's budget
            -- and fair share, its limits, and its webhook); a rate_limit_key that was the source's
            -- model (enqueue_run's default) follows the fork's model.
            INSERT INTO runrow.agent_run (
                conversation_id, user_id, user_message_id, max_attempts, model, prompt_id, metadata,
                forked_from, forked_at_seq, priority, fairness_key, concurrency_key, rate_limit_key,
                token_budget, cost_budget, webhook_url
            )
            VALUES (
                new_conversation, turn.user_id, copy_message, turn.max_attempts, fork_model, turn.prompt_id,
                turn.metadata, turn.id, n, turn.priority, turn.fairness_key, turn.concurrency_key,
                CASE WHEN turn.rate_limit_key = turn.model THEN fork_model ELSE turn.rate_limit_key END,
                turn.token_budget, turn.cost_budget, turn.webhook_url
            )
            RETURNING id INTO copy_run;
            INSERT INTO runrow.run_request (run_id, snapshot)
            SELECT copy_run, jsonb_build_object('content', m.content, 'metadata', turn.metadata)
            FROM runrow.message AS m WHERE m.id = copy_message;
        ELSE
            INSERT INTO runrow.agent_run (
                conversation_id, user_id, user_message_id, status, attempt, max_attempts, model, prompt_id,
                metadata, result, error, started_at, finished_at, forked_from, forked_at_seq
            )
            VALUES (
                new_conversation, turn.user_id, copy_message, turn.status, turn.attempt, turn.max_attempts,
                turn.model, turn.prompt_id, turn.metadata, turn.result, turn.error, turn.started_at,
                turn.finished_at, turn.id, n
            )
            RETURNING id INTO copy_run;
        END IF;

        -- Verbatim: payload is json, so its text (key order, whitespace, signatures) is copied as is.
        PERFORM runrow._copy_steps(turn.id, copy_run, n);
        copied := copied + n;

        -- Thinking is signed for the model that produced it: under another model those blocks
        -- cannot be sent back, and only the caller can decide what to send instead.
        IF turn.model <> fork_model THEN
            drops := drops || coalesce((
                SELECT jsonb_agg(jsonb_build_object(
                           'run_id', copy_run, 'seq', s.seq, 'index', b.ord - 1, 'type', b.block ->> 'type')
                           ORDER BY s.seq, b.ord)
                FROM runrow.agent_step AS s
                CROSS JOIN LATERAL json_array_elements(runrow._json_probe(s.payload)) WITH ORDINALITY AS b (block, ord)
                WHERE s.run_id = copy_run AND s.kind = 'model_turn'
                  AND b.block ->> 'type' IN ('thinking', 'redacted_thinking')), '[]');
        END IF;
    END LOOP;

    PERFORM runrow._journal(copy_run, jsonb_build_array(
        jsonb_build_object('type', 'user_message_created', 'message_id', copy_message),
        jsonb_build_object('type', 'run_queued', 'run_id', copy_run, 'forked_from', src.id, 'at_seq', fork_run.at_seq)
    ));
    PERFORM runrow._wake_dispatchers(new_conversation);
    RETURN QUERY SELECT copy_run, new_conversation, copied, drops;
END
$fn$;

COMMENT ON FUNCTION runrow.fork_run(uuid, integer, text) IS
'Start a new run (new_run_id) in a new conversation (new_conversation_id, owned by the source conversation''s user) whose history '
'is run_id''s, up to and including its step at_seq (agent_step.seq of run_id; 0 = its user message '
'only). The earlier turns of the source conversation that its history holds (completed, or '
'cancelled after a step, and whose last model_turn''s stop_reason is not refusal) are copied as '
'they ended, then run_id''s user message and steps 1..at_seq '
'into a queued run pinned to the same prompt and metadata, with the source''s fleet settings '
'(priority, fairness_key, concurrency_key, token_budget, cost_budget, webhook_url; rate_limit_key '
'too, or the fork''s model when it was the source''s model), with model (default: the source''s) '
'and forked_from/forked_at_seq naming what it copies. Every agent_step row is copied verbatim '
'(payload bytes, request_id, attempt, usage, stop_reason, stop_sequence, stop_details), so conversation_history of the fork '
'rebuilds the source''s model input byte for byte and thinking signatures stay valid; the worker '
'that claims the fork resumes from its last copied step like any resumed run. Returns the new run, '
'its conversation, the number of steps copied and must_drop: the thinking and redacted_thinking '
'blocks ({run_id, seq, index, type}, index 0-based in the step''s content array) produced by a '
'model other than the fork''s, which a request under the new model must leave out ([] when the '
'model is unchanged). One transaction; wakes the dispatchers. Steps written to run_id after the '
'fork are never part of it. 22004 for a NULL run_id or at_seq, P0002 for an unknown run_id, '
'22023 for an at_seq outside 0..the run''s last step or a bad model; nothing is written then.';

REVOKE ALL ON FUNCTION runrow.fork_run(uuid, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.fork_run(uuid, integer, text) TO runrow_client;
