CREATE OR REPLACE FUNCTION runrow.get_conversation(conversation_id uuid)
RETURNS TABLE (
    id uuid,
    user_id text,
    created_at timestamptz,
    active_run_id uuid,
    active_status text,
    runs bigint
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    PERFORM runrow._require_not_null(get_conversation.conversation_id, 'conversation_id');
    RETURN QUERY
    SELECT c.id, c.user_id, c.created_at, act.id, act.status,
           -- Every turn: the active, queued and ended ones, each part through its index.
           (SELECT count(*) FROM runrow.agent_run AS n
            WHERE n.conversation_id = c.id AND n.status IN ('running', 'waiting'))
           + (SELECT count(*) FROM runrow.agent_run AS n
              WHERE n.conversation_id = c.id AND n.status = 'queued')
           + (SELECT count(*) FROM runrow.agent_run AS n
              WHERE n.conversation_id = c.id AND n.status IN ('completed', 'failed', 'cancelled', 'dead'))
    FROM runrow.conversation AS c
    LEFT JOIN LATERAL (
        -- The oldest open turn: the active one, or else the oldest queued one.
        SELECT o.id, o.status FROM (
            SELECT a.id, a.status, a.enqueue_seq FROM runrow.agent_run AS a
            WHERE a.conversation_id = c.id AND a.status IN ('running', 'waiting')
            UNION ALL
            (SELECT a.id, a.status, a.enqueue_seq FROM runrow.agent_run AS a
             WHERE a.conversation_id = c.id AND a.status = 'queued'
             ORDER BY a.enqueue_seq
             LIMIT 1)
        ) AS o
        ORDER BY o.enqueue_seq
        LIMIT 1
    ) AS act ON true
    WHERE c.id = get_conversation.conversation_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'conversation_id % does not exist', get_conversation.conversation_id
            USING ERRCODE = 'no_data_found';
    END IF;
END
$fn$;

COMMENT ON FUNCTION runrow.get_conversation(uuid) IS
'One conversation for clients: its owner (user_id), when it started, its oldest active '
'(queued, running or waiting) run if any, and how many runs it has had. Services use the '
'owner to scope requests to one user. An unknown conversation_id raises P0002.';

REVOKE ALL ON FUNCTION runrow.get_conversation(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.get_conversation(uuid) TO runrow_client, runrow_auditor;
