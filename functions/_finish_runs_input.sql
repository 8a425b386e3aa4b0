-- The input check of a batch of endings, shared by finish_runs and finish_and_claim_runs.

CREATE OR REPLACE FUNCTION runrow._finish_runs_input(
    runs jsonb,
    -- Each element's fields as parallel arrays, in input order: the writers join them to
    -- agent_run as rows (unnest), instead of looking each field up in the JSON by the run's id
    -- text (a uuid_out and two jsonb lookups per field and row: issue 11).
    OUT ids uuid[], OUT tokens uuid[], OUT statuses text[], OUT results jsonb[], OUT errors text[],
    OUT events jsonb[]
)
LANGUAGE plpgsql
-- No SET clauses: it reads no table, and runs under its callers' search_path (a function's own
-- SET is a settings save and restore on every call).
AS $fn$
DECLARE
    bad record;
    uuid_re constant text := '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$';
    -- The pass below tests each run_id and claim_token for the UUID's shape only (36
    -- characters, hyphens in place: one LIKE); the casts that build ids then test its digits.
    -- A case-insensitive match of uuid_re cost about 40,000 instructions per test, two tests
    -- per element: 6% of the backend's work per run in a batch-10 finish_and_claim_runs
    -- (python -m bench.instructions). The exact pass, with the match, runs only when the first
    -- pass or a cast finds something wrong, so the error reported is the first broken rule of
    -- the first bad element, as before.
    uuid_shape constant text := '________-____-____-____-____________';
    exact boolean := false;
BEGIN
    IF _finish_runs_input.runs IS NULL THEN
        -- Called only to raise: a call on every batch would be a statement and a search_path
        -- switch for nothing.
        PERFORM runrow._require_not_null(_finish_runs_input.runs, 'runs');
    END IF;
    IF jsonb_typeof(_finish_runs_input.runs) <> 'array' THEN
        RAISE EXCEPTION 'runs must be a JSON array of run objects, got %', jsonb_typeof(_finish_runs_input.runs)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_array_length(_finish_runs_input.runs) > 1000 THEN
        RAISE EXCEPTION 'runs is too large: at most 1000 runs per call, got %', jsonb_array_length(_finish_runs_input.runs)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    <<passes>>
    LOOP
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
                       WHEN jsonb_typeof(x.el -> 'run_id') <> 'string' OR x.el ->> 'run_id' NOT LIKE uuid_shape
                            OR (exact AND x.el ->> 'run_id' !~* uuid_re) THEN 4
                       WHEN nullif(x.el -> 'claim_token', 'null') IS NULL THEN 5
                       WHEN jsonb_typeof(x.el -> 'claim_token') <> 'string' OR x.el ->> 'claim_token' NOT LIKE uuid_shape
                            OR (exact AND x.el ->> 'claim_token' !~* uuid_re) THEN 6
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
                FROM jsonb_array_elements(_finish_runs_input.runs) WITH ORDINALITY AS e (el, ord)
            ) AS x
        ) AS v
        WHERE v.rule IS NOT NULL
        ORDER BY v.i
        LIMIT 1;
        IF FOUND AND NOT exact THEN
            -- An element before this one may hold a run_id or claim_token of the right shape
            -- that is not hex: the exact pass finds the first broken rule of all.
            exact := true;
            CONTINUE passes;
        END IF;
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

        BEGIN
            -- Every run_id and claim_token is a string of the UUID's shape here; the casts raise
            -- 22P02 for one that is not hex. A JSON null result or events is SQL NULL here.
            SELECT array_agg((x.el ->> 'run_id')::uuid), array_agg((x.el ->> 'claim_token')::uuid),
                   array_agg(x.el ->> 'status'), array_agg(nullif(x.el -> 'result', 'null')),
                   array_agg(x.el ->> 'error'), array_agg(nullif(x.el -> 'events', 'null'))
            INTO ids, tokens, statuses, results, errors, events
            FROM jsonb_array_elements(_finish_runs_input.runs) AS x (el);
            EXIT passes;
        EXCEPTION WHEN invalid_text_representation THEN
            IF exact THEN
                -- Not reached: the exact pass refuses every string a cast refuses.
                RAISE;
            END IF;
            exact := true;
        END;
    END LOOP passes;
END
$fn$;

COMMENT ON FUNCTION runrow._finish_runs_input(jsonb) IS
'Checks runs as finish_runs documents it (a JSON array of at most 1000 objects {run_id, '
'claim_token, status, result?, error?, events?}, each run at most once) and returns the elements'' '
'fields as parallel arrays in input order (ids, tokens, statuses, results, errors, events; a JSON '
'null result or events is NULL; all NULL for an empty array). Bad input raises 22004/22023 naming '
'the element index (runs[i]) and the field. Reads and writes no table.';

REVOKE ALL ON FUNCTION runrow._finish_runs_input(jsonb) FROM PUBLIC;
