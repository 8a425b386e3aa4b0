CREATE OR REPLACE FUNCTION runrow.watch_runs(run_ids uuid[], seconds integer DEFAULT 60)
RETURNS TABLE (run_id uuid, state text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
-- Every lock below is taken with NOWAIT or SKIP LOCKED, but an insert cannot be: one that
-- meets another session's uncommitted row of the same run waits for it. The shortest timeout
-- makes that wait an error the insert's handler turns into busy.
SET lock_timeout = '1ms'
AS $fn$
DECLARE
    rid uuid;
    st text;
    live boolean;
    refreshed uuid [] := '{}';
BEGIN
    PERFORM runrow._require_not_null(watch_runs.run_ids, 'run_ids');
    -- uuid[] takes any number of dimensions; array_position raised 0A000 on more than one.
    IF array_ndims(watch_runs.run_ids) > 1 THEN
        RAISE EXCEPTION 'run_ids must be a one-dimensional array, got % dimensions', array_ndims(watch_runs.run_ids)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cardinality(watch_runs.run_ids) > 1000 THEN
        RAISE EXCEPTION 'run_ids is too large: at most 1000 runs per call, got %', cardinality(watch_runs.run_ids)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(watch_runs.run_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'run_ids must not contain NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM runrow._require_range(watch_runs.seconds, 'seconds', 1, 3600);

    -- Watches whose tail went away without the run ending: a bounded share per call.
    DELETE FROM runrow.run_watch AS w
    WHERE w.run_id = ANY (ARRAY(
        SELECT x.run_id FROM runrow.run_watch AS x
        WHERE x.expires_at <= now()
        ORDER BY x.expires_at
        LIMIT 100
        FOR UPDATE SKIP LOCKED
    ));

    -- Confirmed live watches are already seen by every writer: extended in one statement, no
    -- run lock. A watch another transaction holds (an ending dropping it, another tail's
    -- refresh) is skipped, never waited for: the loop below says busy for it.
    WITH mine AS (
        SELECT x.run_id FROM runrow.run_watch AS x
        WHERE x.run_id = ANY (watch_runs.run_ids) AND x.confirmed AND x.expires_at > now()
        FOR UPDATE SKIP LOCKED
    ),

    extended AS (
        UPDATE runrow.run_watch AS w
        SET expires_at = greatest(w.expires_at, now() + make_interval(secs => watch_runs.seconds))
        FROM mine AS m
        WHERE w.run_id = m.run_id
        RETURNING w.run_id
    )

    SELECT coalesce(array_agg(e.run_id), '{}') INTO refreshed FROM extended AS e;
    RETURN QUERY SELECT r.id, 'watching'::text FROM unnest(refreshed) AS r (id);

    FOR rid IN
        SELECT u.id FROM unnest(watch_runs.run_ids) AS u (id)
        EXCEPT
        SELECT r.id FROM unnest(refreshed) AS r (id)
        ORDER BY 1
    LOOP
        run_id := rid;
        SELECT a.status INTO st FROM runrow.agent_run AS a WHERE a.id = rid;
        IF NOT FOUND THEN
            state := 'unknown';
        ELSIF st IN ('completed', 'failed', 'cancelled', 'dead') THEN
            -- Nothing more is written to an ended run: no watch needed.
            state := 'ended';
        ELSIF st = 'queued' THEN
            -- Not locked: a queued run's lock would make a claim skip it (FOR UPDATE SKIP
            -- LOCKED). Registered, so writes from now on notify, but one in flight may not.
            state := 'queued';
        ELSE
            -- The row lock (FOR SHARE conflicts with every writer's) orders this watch
            -- against the run's writers: one that locked the run before us has committed,
            -- so the tail's next read sees its rows; one that locks it after us sees the
            -- watch in its wake. NOWAIT: a writer in flight means "ask again", not "wait".
            BEGIN
                SELECT a.status INTO st FROM runrow.agent_run AS a WHERE a.id = rid FOR SHARE NOWAIT;
                state := CASE WHEN st IN ('completed', 'failed', 'cancelled', 'dead') THEN 'ended' ELSE 'watching' END;
            EXCEPTION WHEN lock_not_available THEN
                state := 'busy';
            END;
        END IF;
        IF state IN ('queued', 'busy', 'watching') THEN
            live := state = 'watching';
            IF EXISTS (SELECT 1 FROM runrow.run_watch AS x WHERE x.run_id = rid) THEN
                -- Extended (and confirmed), unless another transaction holds it: an ending
                -- dropping it (the run is ending, or runs on if that rolls back), another
                -- tail's registration.
                UPDATE runrow.run_watch AS w
                SET expires_at = greatest(w.expires_at, now() + make_interval(secs => watch_runs.seconds)),
                    -- A lapsed confirmation counts for nothing: writers stopped seeing it.
                    confirmed = live OR (w.confirmed AND w.expires_at > now())
                WHERE w.run_id = (
                    SELECT x.run_id FROM runrow.run_watch AS x WHERE x.run_id = rid FOR UPDATE SKIP LOCKED
                );
                IF NOT FOUND THEN
                    state := 'busy';
                END IF;
            ELSE
                -- A new watch. A registration of the run in flight elsewhere would make the
                -- insert wait for its commit: lock_timeout (the function's SET) makes that
                -- wait an error, busy here.
                BEGIN
                    INSERT INTO runrow.run_watch AS w (run_id, expires_at, confirmed)
                    VALUES (rid, now() + make_interval(secs => watch_runs.seconds), live)
                    ON CONFLICT ON CONSTRAINT run_watch_pkey DO NOTHING;
                    IF NOT FOUND THEN
                        state := 'busy';
                    END IF;
                EXCEPTION WHEN lock_not_available THEN
                    state := 'busy';
                END;
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$fn$;

COMMENT ON FUNCTION runrow.watch_runs(uuid[], integer) IS
'Register (or refresh) the caller''s interest in the journals of run_ids (at most 1000) for '
'seconds (1 to 3600, default 60): while a run is watched, every journal write notifies its '
'channel runrow.events_channel(run_id); a run nobody watches is written without notifications. '
'Call it after LISTEN and before reading the journal, and again within seconds to keep the '
'watch. One row per distinct run, state: watching (every write from now on notifies: wait on '
'the channel), queued (registered, but a write in flight may not have seen it: ask again '
'shortly and poll meanwhile; queued runs are not locked so that no claim skips them), busy (a '
'writer in flight holds the run, or another transaction its watch, such as an ending dropping '
'it: the watch may not be registered or extended, so ask again shortly and poll meanwhile), '
'ended (the run is terminal: read to the end, nothing more comes) or unknown (no such run). '
'Never waits on a lock (a lock held elsewhere is busy). Bad input (run_ids NULL, of more than '
'one dimension, holding NULL or over 1000; seconds NULL or out of range) raises 22004/22023 naming the argument and registers nothing.';

REVOKE ALL ON FUNCTION runrow.watch_runs(uuid[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.watch_runs(uuid[], integer) TO runrow_client, runrow_worker;
