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
    uuid_shape constant text := '________-____-____-____-____________';
    -- Whether the fast pass below proved every element valid.
    valid boolean;
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

    -- The fast pass, which also builds the arrays. It proves every rule holds for every
    -- element with as few expressions as will do: PostgreSQL compiles every expression of a
    -- statement on every call. The exact pass below (a CASE branch per rule, a subplan for the
    -- events, a window for duplicates) ran on every call until issue 11's stop 35, and was 11%
    -- of the backend's work per run of finish_and_claim_runs at batch 1 and at batch 10; with
    -- this pass in front the call costs 6-9% less (python -m bench.instructions). What it
    -- proves, and why that is enough:
    -- - run_id and claim_token: the text has the UUID's shape (LIKE) and casts to uuid, which
    --   only a JSON string of a canonical UUID does (a number has no such hyphens, an object's
    --   or array's text no hex first character; a NULL fails the LIKE);
    -- - status: the text is one of the three, which only those strings are;
    -- - no unknown key; error a string or null; result, error and events within their sizes;
    -- - events an array of objects (strict: an array in it is not unwrapped) whose type is a
    --   string, not empty, not complete, not run_* (lax: a missing type is an empty sequence
    --   there, which fails the test, not an error).
    -- A bad element makes it false, or makes a cast or an operator raise (class 22). Then the
    -- exact pass names the first broken rule of the first bad element, as it always has.
    BEGIN
        SELECT array_agg((x.el ->> 'run_id')::uuid), array_agg((x.el ->> 'claim_token')::uuid),
               array_agg(x.el ->> 'status'), array_agg(nullif(x.el -> 'result', 'null')),
               array_agg(x.el ->> 'error'), array_agg(nullif(x.el -> 'events', 'null')),
               bool_and(coalesce(
                   x.el ->> 'run_id' LIKE uuid_shape
                   AND x.el ->> 'claim_token' LIKE uuid_shape
                   AND x.el ->> 'status' IN ('completed', 'failed', 'cancelled')
                   AND x.el - '{run_id,claim_token,status,result,error,events}'::text[] = '{}'
                   AND coalesce(octet_length((x.el -> 'result')::text) <= 1048576, true)
                   AND coalesce(runrow._json_portable(x.el -> 'result'), true)
                   AND coalesce(jsonb_typeof(x.el -> 'error') IN ('string', 'null'), true)
                   AND coalesce(length(x.el ->> 'error') <= 10000, true)
                   AND (nullif(x.el -> 'events', 'null') IS NULL
                        OR (jsonb_typeof(x.el -> 'events') = 'array'
                            AND jsonb_array_length(x.el -> 'events') <= 1000
                            AND octet_length((x.el -> 'events')::text) <= 4194304
                            AND runrow._events_ok(x.el -> 'events'))),
                   false))
        INTO ids, tokens, statuses, results, errors, events, valid
        FROM jsonb_array_elements(_finish_runs_input.runs) AS x (el);
    EXCEPTION WHEN data_exception THEN
        valid := false;
    END;
    IF coalesce(valid, true) THEN
        -- Each run at most once, looked for only where there are two: a statement of its own
        -- (an IF holding a subquery starts its plan even when the test before it settles it).
        IF coalesce(cardinality(ids), 0) < 2 THEN
            RETURN;
        END IF;
        IF (SELECT count(DISTINCT d.id) FROM unnest(ids) AS d (id)) = cardinality(ids) THEN
            RETURN;
        END IF;
    END IF;

    -- The exact pass: the first broken rule (CASE stops at it) of the first bad element, whose
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
                   WHEN runrow._json_too_deep(x.el -> 'result') THEN 16
                   WHEN NOT runrow._json_portable(x.el -> 'result') THEN 17
                   WHEN jsonb_typeof(x.el -> 'error') NOT IN ('string', 'null') THEN 10
                   WHEN length(x.el ->> 'error') > 10000 THEN 11
                   WHEN jsonb_typeof(x.el -> 'events') NOT IN ('array', 'null') THEN 12
                   WHEN jsonb_typeof(x.el -> 'events') = 'array'
                        AND (jsonb_array_length(x.el -> 'events') > 1000
                             OR octet_length((x.el -> 'events')::text) > 4194304) THEN 13
                   WHEN jsonb_typeof(x.el -> 'events') = 'array' AND runrow._first_bad_event(x.el -> 'events') IS NOT NULL THEN 14
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
                WHEN 16 THEN '.result nests 100 levels deep or more: JSON clients cannot read it back (at most 99)'
                WHEN 17 THEN '.result holds a number no double can hold (beyond ±1.7976931348623157e308): JSON '
                    'clients cannot read it back'
                WHEN 10 THEN format('.error must be a string or null, got %s', jsonb_typeof(bad.el -> 'error'))
                WHEN 11 THEN '.error is too long: at most 10000 characters'
                WHEN 12 THEN format('.events must be a JSON array of event objects, got %s',
                    jsonb_typeof(bad.el -> 'events'))
                WHEN 13 THEN '.events is too large: at most 1000 events and 4 MiB per run'
                WHEN 14 THEN format('.events[%s] must be an object with a non-empty string "type" that is not '
                    'reserved ("complete" and "run_*" are written by runrow itself) and has no control character',
                    runrow._first_bad_event(bad.el -> 'events'))
                ELSE format('.run_id %s is already runs[%s]: each run at most once per call', bad.el -> 'run_id',
                    bad.first)
            END
            USING ERRCODE = CASE WHEN bad.rule IN (3, 5, 7) THEN 'null_value_not_allowed' ELSE 'invalid_parameter_value' END;
    END IF;

    -- Valid after all: the fast pass's proof is sufficient, not necessary (an element the exact
    -- pass accepts and the fast pass does not, if there is one, is only slower). Nothing here
    -- raises: the exact pass refuses every string the casts refuse.
    SELECT array_agg((x.el ->> 'run_id')::uuid), array_agg((x.el ->> 'claim_token')::uuid),
           array_agg(x.el ->> 'status'), array_agg(nullif(x.el -> 'result', 'null')),
           array_agg(x.el ->> 'error'), array_agg(nullif(x.el -> 'events', 'null'))
    INTO ids, tokens, statuses, results, errors, events
    FROM jsonb_array_elements(_finish_runs_input.runs) AS x (el);
END
$fn$;

COMMENT ON FUNCTION runrow._finish_runs_input(jsonb) IS
'Checks runs as finish_runs documents it (a JSON array of at most 1000 objects {run_id, '
'claim_token, status, result?, error?, events?}, each run at most once) and returns the elements'' '
'fields as parallel arrays in input order (ids, tokens, statuses, results, errors, events; a JSON '
'null result or events is NULL; all NULL for an empty array). Bad input raises 22004/22023 naming '
'the element index (runs[i]) and the field. Reads and writes no table.';

REVOKE ALL ON FUNCTION runrow._finish_runs_input(jsonb) FROM PUBLIC;
