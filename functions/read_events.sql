CREATE OR REPLACE FUNCTION runrow.read_events(run_id uuid, after_seq bigint DEFAULT 0, max_events integer DEFAULT 500)
RETURNS TABLE (seq bigint, type text, payload jsonb, created_at timestamptz)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
-- By run_event's key whatever the statistics say (a trimmed, vacuumed journal looks empty to
-- the planner, which then prices the key above a scan of the table), and never JIT-compiled
-- (the same statistics price the key's lookup above jit_above_cost: migration 0063).
SET enable_seqscan = off
SET jit = off
AS $fn$
DECLARE
    r runrow.agent_run;
    n integer;
    last_seq bigint;
    last_type text;
    complete_seq bigint;
BEGIN
    -- The helpers only raise: called only when a test here fails, not as a statement each on
    -- every read of a stream (see enqueue_run).
    IF read_events.run_id IS NULL
       OR read_events.after_seq IS NULL OR read_events.after_seq NOT BETWEEN 0 AND 9223372036854775806
       OR read_events.max_events IS NULL OR read_events.max_events NOT BETWEEN 1 AND 10000 THEN
        PERFORM runrow._require_not_null(read_events.run_id, 'run_id');
        PERFORM runrow._require_range(read_events.after_seq, 'after_seq', 0, 9223372036854775806);
        PERFORM runrow._require_range(read_events.max_events, 'max_events', 1, 10000);
    END IF;
    SELECT a.* INTO r FROM runrow.agent_run AS a WHERE a.id = read_events.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run_id % does not exist', read_events.run_id USING ERRCODE = 'no_data_found';
    END IF;

    RETURN QUERY
    SELECT e.seq, e.type, e.payload, e.created_at
    FROM runrow.run_event AS e
    WHERE e.run_id = read_events.run_id AND e.seq > read_events.after_seq
    ORDER BY e.seq
    LIMIT read_events.max_events;
    GET DIAGNOSTICS n = ROW_COUNT;

    -- The page was not full, so the reader is at the end of the journal, and a terminal
    -- run's read that reaches the end always ends in a complete. When the page holds none
    -- (the journal was trimmed, a finalizer died mid-way, or the cursor is at or past the
    -- journal's own complete), one is synthesized from the row. The last case matters: a
    -- reader that waited on a live run with a cursor past its end (stale, or another run's)
    -- would otherwise wait forever once the run ends, its complete landing below the cursor.
    IF n < read_events.max_events AND r.status IN ('completed', 'failed', 'cancelled', 'dead') THEN
        -- A run's complete is its last journal row (the seq trigger journals nothing after
        -- one, migration 0039): one read of the last row, by the primary key, gives both.
        SELECT e.seq, e.type INTO last_seq, last_type
        FROM runrow.run_event AS e
        WHERE e.run_id = read_events.run_id
        ORDER BY e.seq DESC
        LIMIT 1;
        complete_seq := CASE WHEN last_type = 'complete' THEN last_seq END;
        last_seq := coalesce(last_seq, 0);
        IF complete_seq IS NULL OR complete_seq <= read_events.after_seq THEN
            RETURN QUERY SELECT
                greatest(last_seq, read_events.after_seq) + 1,
                'complete'::text,
                jsonb_build_object('type', 'complete', 'status', r.status, 'result', r.result,
                                   'error', r.error, 'synthesized', true)
                || CASE WHEN complete_seq IS NULL THEN '{}'::jsonb
                        ELSE jsonb_build_object('complete_seq', complete_seq) END,
                r.finished_at;
        END IF;
    END IF;
END
$fn$;

COMMENT ON FUNCTION runrow.read_events(uuid, bigint, integer) IS
'Journal events of a run with seq > after_seq, in order, at most max_events (1..10000). '
'payload is the event object as written, type included. A read that reaches the end of a '
'terminal run''s journal always ends in a complete: when none is among the rows returned '
'(journal trimmed, a finalizer died mid-way, or after_seq at or past the journal''s own '
'complete), a synthesized frame built from the run row (status, result, error, '
'synthesized: true, and complete_seq: the seq of the journal''s own complete when it has '
'one) follows at max(last seq, after_seq) + 1, so no reader waits on an ended run whatever '
'its cursor. A live run''s journal read at or past its end returns no rows (wait, re-read). '
'Unknown run_id: P0002.';

REVOKE ALL ON FUNCTION runrow.read_events(uuid, bigint, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.read_events(uuid, bigint, integer) TO runrow_client, runrow_worker;
