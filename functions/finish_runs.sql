CREATE OR REPLACE FUNCTION runrow.finish_runs(runs jsonb)
RETURNS TABLE (run_id uuid, finished boolean, last_seq bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow
-- The statements' shapes are fixed: plan them once per session, not for every call (the
-- custom plans PL/pgSQL tries first, and keeps for = ANY (array), cost more to build than
-- to run).
SET plan_cache_mode = force_generic_plan
-- Every lookup here is by key (agent_run's and run_watch's primary keys, the journal's): a
-- generic plan made while agent_run was small (a fresh install, planned as 10 pages) found a
-- sequential scan cheaper than ten key probes and kept it as the table grew.
SET enable_seqscan = off
AS $fn$
DECLARE
    bad record;
    ids uuid[];
    byid jsonb;
    done_ids uuid[];
    done_seqs bigint[];
    watched_ids uuid[];
    uuid_re constant text := '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$';
BEGIN
    IF finish_runs.runs IS NULL THEN
        -- Called only to raise: a call on every batch would be a statement and a search_path
        -- switch for nothing.
        PERFORM runrow._require_not_null(finish_runs.runs, 'runs');
    END IF;
    IF jsonb_typeof(finish_runs.runs) <> 'array' THEN
        RAISE EXCEPTION 'runs must be a JSON array of run objects, got %', jsonb_typeof(finish_runs.runs)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_array_length(finish_runs.runs) > 1000 THEN
        RAISE EXCEPTION 'runs is too large: at most 1000 runs per call, got %', jsonb_array_length(finish_runs.runs)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Every element checked before anything is written: the first broken rule (CASE stops
    -- at it, so a valid batch costs one pass of cheap tests) of the first bad element, whose
    -- message is built only then. No test casts: each is safe on any JSON value.
    SELECT v.i, v.el, v.rule, v.first INTO bad
    FROM (
        SELECT x.ord - 1 AS i, x.el, x.first - 1 AS first,
               CASE
                   WHEN jsonb_typeof(x.el) <> 'object' THEN 1
                   WHEN x.el - ARRAY['run_id', 'claim_token', 'status', 'result', 'error', 'events'] <> '{}' THEN 2
                   WHEN nullif(x.el -> 'run_id', 'null') IS NULL THEN 3
                   WHEN jsonb_typeof(x.el -> 'run_id') <> 'string' OR x.el ->> 'run_id' !~* uuid_re THEN 4
                   WHEN nullif(x.el -> 'claim_token', 'null') IS NULL THEN 5
                   WHEN jsonb_typeof(x.el -> 'claim_token') <> 'string' OR x.el ->> 'claim_token' !~* uuid_re THEN 6
                   WHEN nullif(x.el -> 'status', 'null') IS NULL THEN 7
                   WHEN jsonb_typeof(x.el -> 'status') <> 'string'
                        OR x.el ->> 'status' NOT IN ('completed', 'failed', 'cancelled') THEN 8
                   WHEN octet_length((x.el -> 'result')::text) > 1048576 THEN 9
                   WHEN jsonb_typeof(x.el -> 'error') NOT IN ('string', 'null') THEN 10
                   WHEN length(x.el ->> 'error') > 10000 THEN 11
                   WHEN jsonb_typeof(x.el -> 'events') NOT IN ('array', 'null') THEN 12
                   WHEN jsonb_typeof(x.el -> 'events') = 'array'
                        AND (jsonb_array_length(x.el -> 'events') > 1000
                             OR octet_length((x.el -> 'events')::text) > 4194304) THEN 13
                   WHEN jsonb_typeof(x.el -> 'events') = 'array' AND EXISTS (
                       SELECT 1 FROM jsonb_array_elements(x.el -> 'events') AS e (ev)
                       WHERE (jsonb_typeof(e.ev) <> 'object'
                              OR jsonb_typeof(e.ev -> 'type') IS DISTINCT FROM 'string'
                              OR e.ev ->> 'type' = ''
                              OR e.ev ->> 'type' = 'complete'
                              OR e.ev ->> 'type' LIKE 'run\_%')) THEN 14
                   WHEN x.first < x.ord THEN 15
               END AS rule
        FROM (
            -- first: where this run_id first appears (a run given twice is an error).
            SELECT e.el, e.ord, min(e.ord) OVER (PARTITION BY lower(e.el ->> 'run_id')) AS first
            FROM jsonb_array_elements(finish_runs.runs) WITH ORDINALITY AS e (el, ord)
        ) AS x
    ) AS v
    WHERE v.rule IS NOT NULL
    ORDER BY v.i
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'runs[%]%', bad.i, CASE bad.rule
                WHEN 1 THEN format(' must be a JSON object, got %s', jsonb_typeof(bad.el))
                WHEN 2 THEN format(' has an unknown key %s (allowed: run_id, claim_token, status, result, error, events)',
                    (SELECT string_agg(format('"%s"', k.key), ', ')
                     FROM jsonb_object_keys(bad.el - ARRAY['run_id', 'claim_token', 'status', 'result', 'error', 'events'])
                         AS k (key)))
                WHEN 3 THEN '.run_id must not be NULL'
                WHEN 4 THEN format('.run_id must be a UUID string, got %s', bad.el -> 'run_id')
                WHEN 5 THEN '.claim_token must not be NULL'
                WHEN 6 THEN format('.claim_token must be a UUID string, got %s', bad.el -> 'claim_token')
                WHEN 7 THEN '.status must not be NULL'
                WHEN 8 THEN format('.status must be one of completed, failed, cancelled, got %s', bad.el -> 'status')
                WHEN 9 THEN '.result is too large: the limit is 1 MiB'
                WHEN 10 THEN format('.error must be a string or null, got %s', jsonb_typeof(bad.el -> 'error'))
                WHEN 11 THEN '.error is too long: at most 10000 characters'
                WHEN 12 THEN format('.events must be a JSON array of event objects, got %s',
                    jsonb_typeof(bad.el -> 'events'))
                WHEN 13 THEN '.events is too large: at most 1000 events and 4 MiB per run'
                WHEN 14 THEN format('.events[%s] must be an object with a non-empty string "type" that is not '
                    'reserved ("complete" and "run_*" are written by runrow itself)',
                    (SELECT min(e.ord) - 1 FROM jsonb_array_elements(bad.el -> 'events') WITH ORDINALITY AS e (ev, ord)
                     WHERE (jsonb_typeof(e.ev) <> 'object'
                         OR jsonb_typeof(e.ev -> 'type') IS DISTINCT FROM 'string'
                         OR e.ev ->> 'type' = ''
                         OR e.ev ->> 'type' = 'complete'
                         OR e.ev ->> 'type' LIKE 'run\_%')))
                ELSE format('.run_id %s is already runs[%s]: each run at most once per call', bad.el -> 'run_id',
                    bad.first)
            END
            USING ERRCODE = CASE WHEN bad.rule IN (3, 5, 7) THEN 'null_value_not_allowed' ELSE 'invalid_parameter_value' END;
    END IF;

    SELECT array_agg((x.el ->> 'run_id')::uuid), jsonb_object_agg((x.el ->> 'run_id')::uuid::text, x.el)
    INTO ids, byid
    FROM jsonb_array_elements(finish_runs.runs) AS x (el);

    -- The fenced terminal writes, each exactly finish_run's: only while the token matches,
    -- which is only while the run is running (agent_run_claim_iff_running: a claim token is
    -- set exactly while the status is 'running'); a run fenced out is simply not updated.
    -- The status is deliberately not tested here: a test the planner can match to the
    -- partial index of active runs made the generic plan AND that index with the primary
    -- key, and a bitmap scan reads every dead entry of runs ended since the last vacuum
    -- (8,283 index entries per call after a 15,000-run drain). Only the primary key serves
    -- this lookup (and enable_seqscan = off keeps a small table's plan from scanning it).
    -- Then each finished run's events and its complete event at the next seqs, as
    -- append_events and finish_run would journal them in one transaction.
    WITH fin AS (
        UPDATE runrow.agent_run AS r
        SET status = byid -> r.id::text ->> 'status',
            result = nullif(byid -> r.id::text -> 'result', 'null'),
            error = byid -> r.id::text ->> 'error',
            finished_at = now(),
            claim_token = NULL,
            claim_expires_at = NULL,
            -- Every writer stamps updated_at itself (no BEFORE trigger does, since 0030).
            updated_at = now()
        WHERE r.id = ANY (ids)
          AND r.claim_token = (byid -> r.id::text ->> 'claim_token')::uuid
        RETURNING r.id, r.conversation_id, r.status, r.result, r.error
    ),
    journaled AS (
        -- seq NULL: the guard trigger assigns each row the next one of its run, in this
        -- order (it sees the rows inserted before it), and RETURNING reads them back.
        INSERT INTO runrow.run_event (run_id, seq, type, payload)
        SELECT f.id, NULL::bigint, e.ev ->> 'type', e.ev
        FROM fin AS f
        CROSS JOIN LATERAL jsonb_array_elements(
            coalesce(nullif(byid -> f.id::text -> 'events', 'null'), '[]')
            || jsonb_build_array(jsonb_build_object(
                'type', 'complete', 'status', f.status, 'result', f.result, 'error', f.error))
        ) WITH ORDINALITY AS e (ev, ord)
        ORDER BY f.id, e.ord
        RETURNING run_event.run_id, run_event.seq
    )
    SELECT array_agg(l.run_id), array_agg(l.seq)
    INTO done_ids, done_seqs
    FROM (SELECT j.run_id, max(j.seq) AS seq FROM journaled AS j GROUP BY j.run_id) AS l;

    -- The wakes: each finished run's tails once, with its last seq, if a tail watches it
    -- (its watches go: nothing more is written to an ended run); the dispatchers were woken
    -- by the UPDATE's triggers where an ending lets a run start (migration 0025).
    WITH gone AS (
        DELETE FROM runrow.run_watch AS w WHERE w.run_id = ANY (done_ids)
        RETURNING w.run_id, w.expires_at
    )
    SELECT array_agg(g.run_id) INTO watched_ids FROM gone AS g WHERE g.expires_at > now();
    PERFORM pg_notify(runrow.events_channel(d.id), d.seq::text)
    FROM unnest(done_ids, done_seqs) AS d (id, seq)
    WHERE current_setting('transaction_isolation') <> 'read committed' OR d.id = ANY (watched_ids);

    RETURN QUERY
    SELECT (x.el ->> 'run_id')::uuid, d.seq IS NOT NULL, d.seq
    FROM jsonb_array_elements(finish_runs.runs) WITH ORDINALITY AS x (el, ord)
    LEFT JOIN unnest(done_ids, done_seqs) AS d (id, seq) ON d.id = (x.el ->> 'run_id')::uuid
    ORDER BY x.ord;
END
$fn$;

COMMENT ON FUNCTION runrow.finish_runs(jsonb) IS
'Many fenced terminal writes in one call: runs is a JSON array (at most 1000) of objects '
'{run_id, claim_token, status, result?, error?, events?}. Each run is fenced on its own exactly '
'as finish_run: only while its claim_token matches and it is running; then its events (as '
'append_events would append them) and the one complete event are journaled at the next seqs, '
'its tails are notified once with the last seq (when a tail watches it: watch_runs), and the '
'dispatchers once per conversation whose next turn (or capped key) may now start. A '
'run fenced out writes nothing and comes back finished = false, last_seq NULL; the others '
'proceed. One row per element, in input order. Bad input (runs not an array, an element not an '
'object, an unknown key, a missing or malformed run_id, claim_token or status, oversize result, '
'error or events, a reserved event type, a run twice) raises 22004/22023 naming the element '
'index (runs[i]) and the field, and writes nothing.';

REVOKE ALL ON FUNCTION runrow.finish_runs(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.finish_runs(jsonb) TO runrow_worker;
