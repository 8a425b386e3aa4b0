CREATE OR REPLACE FUNCTION runrow.conversation_history(conversation_id uuid, up_to_run_id uuid)
RETURNS TABLE (
    run_id uuid,
    turn_index integer,
    message_index integer,
    role text,
    source text,
    seq integer,
    kind text,
    payload json,
    run_status text,
    created_at timestamptz
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    target runrow.agent_run;
BEGIN
    PERFORM runrow._require_not_null(conversation_history.conversation_id, 'conversation_id');
    PERFORM runrow._require_not_null(conversation_history.up_to_run_id, 'up_to_run_id');
    SELECT a.* INTO target FROM runrow.agent_run AS a WHERE a.id = conversation_history.up_to_run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'up_to_run_id % does not exist', conversation_history.up_to_run_id
            USING ERRCODE = 'no_data_found';
    END IF;
    IF target.conversation_id <> conversation_history.conversation_id THEN
        RAISE EXCEPTION 'up_to_run_id % is not a run of conversation %',
            conversation_history.up_to_run_id, conversation_history.conversation_id
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    RETURN QUERY
    WITH earlier AS (
        -- The earlier turns that may contribute. Every rule depends only on what is final once
        -- a turn is terminal, so a turn contributes the same rows to every later rebuild
        -- (history only ever grows at the end). They have ended: read through
        -- agent_run_ended_by_conversation; the target itself is already in hand.
        SELECT a.id, a.enqueue_seq, a.status, a.user_message_id
        FROM runrow.agent_run AS a
        WHERE a.conversation_id = target.conversation_id
          AND a.enqueue_seq < target.enqueue_seq
          AND a.status IN ('completed', 'failed', 'cancelled', 'dead')
          AND (
              a.status = 'completed'
              -- A stopped turn the model already acted in: what it did stays true.
              OR (a.status = 'cancelled' AND EXISTS (SELECT 1 FROM runrow.agent_step AS s WHERE s.run_id = a.id))
          )
    ),
    last_turns AS (
        -- The latest model turn of each earlier turn: how it ended, and its tool_uses (to
        -- answer the dangling ones).
        SELECT DISTINCT ON (s.run_id) s.run_id, s.seq, s.payload, s.stop_reason
        FROM earlier AS e
        JOIN runrow.agent_step AS s ON s.run_id = e.id AND s.kind = 'model_turn'
        ORDER BY s.run_id, s.seq DESC
    ),
    turns AS (
        -- Which turns contribute: the earlier ones but those that ended in a refusal, then
        -- the target. A refused turn contributes nothing, its user message included: the API
        -- refuses every later request that still holds a refused exchange ("reset the
        -- conversation context"). Read from the step log, which last_turns reads anyway.
        SELECT t.id, t.enqueue_seq, t.status, t.user_message_id, t.id = target.id AS is_target,
               row_number() OVER (ORDER BY t.enqueue_seq)::integer AS turn_index
        FROM (
            SELECT e.id, e.enqueue_seq, e.status, e.user_message_id
            FROM earlier AS e
            WHERE NOT EXISTS (SELECT 1 FROM last_turns AS l WHERE l.run_id = e.id AND l.stop_reason = 'refusal')
            UNION ALL
            SELECT target.id, target.enqueue_seq, target.status, target.user_message_id
        ) AS t
    ),
    blocks AS (
        SELECT t.id AS run_id, t.turn_index, 0 AS pos, 0::bigint AS sub, 'user'::text AS role,
               'user_message'::text AS source, NULL::integer AS seq, 'user_message'::text AS kind,
               m.content::text::json AS payload, t.status AS run_status, m.created_at
        FROM turns AS t
        JOIN runrow.message AS m ON m.id = t.user_message_id
        UNION ALL
        SELECT t.id, t.turn_index, s.seq, 0::bigint,
               CASE s.kind WHEN 'model_turn' THEN 'assistant' ELSE 'user' END,
               'step', s.seq, s.kind, s.payload, t.status, s.created_at
        FROM turns AS t
        JOIN runrow.agent_step AS s ON s.run_id = t.id
        UNION ALL
        -- An earlier turn that ended on a tool_use with no result (it was stopped while a
        -- tool ran or waited for approval): a tool_result is synthesized for it, after the
        -- turn's last step, so the next request is a valid conversation. Nothing stored
        -- changes; the text depends only on final data, so it is the same on every rebuild.
        SELECT t.id, t.turn_index, 2147483647, b.ord, 'user', 'synthesized', NULL::integer, 'tool_result',
               format('{"type":"tool_result","tool_use_id":%s,"content":%s,"is_error":true}',
                      to_json(b.block ->> 'id')::text,
                      to_json(format('No result: this turn was %s before the tool call completed.', t.status))::text
               )::json,
               t.status, NULL::timestamptz
        FROM turns AS t
        JOIN last_turns AS l ON l.run_id = t.id
        -- Probed: the JSON operators raise on a \u0000 anywhere in the turn (its text may hold one).
        CROSS JOIN LATERAL json_array_elements(runrow._json_probe(l.payload)) WITH ORDINALITY AS b (block, ord)
        WHERE b.block ->> 'type' = 'tool_use'
          AND NOT EXISTS (
              SELECT 1 FROM runrow.agent_step AS r
              WHERE r.run_id = t.id AND r.kind = 'tool_result' AND r.tool_use_id = b.block ->> 'id')
    ),
    ordered AS (
        SELECT x.*, row_number() OVER (ORDER BY x.turn_index, x.pos, x.sub) AS n,
               CASE WHEN x.role IS DISTINCT FROM lag(x.role) OVER (ORDER BY x.turn_index, x.pos, x.sub)
                    THEN 1 ELSE 0 END AS starts_message
        FROM blocks AS x
    )
    SELECT o.run_id, o.turn_index,
           (sum(o.starts_message) OVER (ORDER BY o.n))::integer,
           o.role, o.source, o.seq, o.kind, o.payload, o.run_status, o.created_at
    FROM ordered AS o
    ORDER BY o.n;
END
$fn$;

COMMENT ON FUNCTION runrow.conversation_history(uuid, uuid) IS
'Everything a worker needs to rebuild the model input of run up_to_run_id byte for byte, in '
'order: for each contributing turn of the conversation up to and including that run, its user '
'message (source user_message, kind user_message, payload = the message content) then its '
'steps (source step, payload = the json exactly as append_step stored it). Contributing: the '
'run itself, every earlier completed turn, and every earlier cancelled turn that has at least '
'one step. Failed and dead turns contribute nothing (a person''s retry_run is a new turn with '
'the same user message, placed where it was enqueued); turns stopped before any step '
'contribute nothing (a draft); an earlier turn whose last model_turn step has stop_reason '
'refusal contributes nothing, neither its user message nor its steps (the Messages API refuses '
'every later request that still holds a refused exchange: the context is reset past it). An '
'earlier turn whose last model turn has a tool_use without a '
'result gets one synthesized row per such tool_use (source synthesized, seq NULL): '
'{"type":"tool_result","tool_use_id":...,"content":"No result: this turn was <status> before '
'the tool call completed.","is_error":true}. Stored rows never change and every rule reads '
'only what is final once a turn ended, so history only grows at its end. message_index '
'numbers the Messages API messages: consecutive rows of the same role share one (roles then '
'alternate, starting with user). Build each message''s content from its rows in order: a lone '
'user_message row whose payload is a JSON string is the content itself; otherwise concatenate '
'the blocks (a model_turn payload is an array of blocks, a tool_result row is one block, a '
'user_message string becomes {"type":"text","text":...}, a user_message array contributes its '
'blocks). Read payload as text to keep its bytes. 22004 for NULLs, P0002 for an unknown run, '
'22023 for a run of another conversation.';

REVOKE ALL ON FUNCTION runrow.conversation_history(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.conversation_history(uuid, uuid) TO runrow_worker;
