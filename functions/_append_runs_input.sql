-- The input check of a batch of appends (append_runs_events): the rules of append_events for
-- each element, named by its index.

CREATE OR REPLACE FUNCTION runrow._append_runs_input(
    runs jsonb,
    -- The elements' run ids, in input order (the writer reads the other fields from the JSON,
    -- in the one statement that writes them).
    OUT ids uuid[]
)
LANGUAGE plpgsql
-- No SET clauses: it reads no table, and runs under its caller's search_path.
AS $fn$
DECLARE
    bad record;
    uuid_re constant text := '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$';
    uuid_shape constant text := '________-____-____-____-____________';
    -- Whether the fast pass below proved every element valid.
    valid boolean;
BEGIN
    IF _append_runs_input.runs IS NULL THEN
        PERFORM runrow._require_not_null(_append_runs_input.runs, 'runs');
    END IF;
    IF jsonb_typeof(_append_runs_input.runs) <> 'array' THEN
        RAISE EXCEPTION 'runs must be a JSON array of run objects, got %', jsonb_typeof(_append_runs_input.runs)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_array_length(_append_runs_input.runs) > 1000 THEN
        RAISE EXCEPTION 'runs is too large: at most 1000 runs per call, got %', jsonb_array_length(_append_runs_input.runs)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The fast pass, which also builds the arrays: as few expressions as prove every rule for
    -- every element (PostgreSQL compiles each expression of a statement on every call; see
    -- _finish_runs_input for why each test is enough). A bad element makes it false or makes a
    -- cast raise; the exact pass then names the first broken rule of the first bad element.
    BEGIN
        SELECT array_agg((x.el ->> 'run_id')::uuid),
               bool_and(coalesce(
                   x.el ->> 'run_id' LIKE uuid_shape
                   AND x.el ->> 'claim_token' LIKE uuid_shape
                   AND x.el - '{run_id,claim_token,events}'::text[] = '{}'
                   AND jsonb_typeof(x.el -> 'events') = 'array'
                   AND jsonb_array_length(x.el -> 'events') BETWEEN 1 AND 1000
                   AND octet_length((x.el -> 'events')::text) <= 4194304
                   AND runrow._events_ok(x.el -> 'events'),
                   false))
        INTO ids, valid
        FROM jsonb_array_elements(_append_runs_input.runs) AS x (el);
    EXCEPTION WHEN data_exception THEN
        valid := false;
    END;
    IF coalesce(valid, true) THEN
        -- Each run at most once, looked for only where there are two.
        IF coalesce(cardinality(ids), 0) < 2 THEN
            RETURN;
        END IF;
        IF (SELECT count(DISTINCT d.id) FROM unnest(ids) AS d (id)) = cardinality(ids) THEN
            RETURN;
        END IF;
    END IF;

    -- The exact pass: the first broken rule (CASE stops at it) of the first bad element. No
    -- test casts: each is safe on any JSON value.
    SELECT v.i, v.el, v.rule, v.first INTO bad
    FROM (
        SELECT x.ord - 1 AS i, x.el, x.first - 1 AS first,
               CASE
                   WHEN jsonb_typeof(x.el) <> 'object' THEN 1
                   WHEN x.el - ARRAY['run_id', 'claim_token', 'events'] <> '{}' THEN 2
                   WHEN nullif(x.el -> 'run_id', 'null') IS NULL THEN 3
                   WHEN jsonb_typeof(x.el -> 'run_id') <> 'string' OR x.el ->> 'run_id' !~* uuid_re THEN 4
                   WHEN nullif(x.el -> 'claim_token', 'null') IS NULL THEN 5
                   WHEN jsonb_typeof(x.el -> 'claim_token') <> 'string' OR x.el ->> 'claim_token' !~* uuid_re THEN 6
                   WHEN nullif(x.el -> 'events', 'null') IS NULL THEN 7
                   WHEN jsonb_typeof(x.el -> 'events') <> 'array' THEN 8
                   WHEN jsonb_array_length(x.el -> 'events') = 0 THEN 9
                   WHEN jsonb_array_length(x.el -> 'events') > 1000
                        OR octet_length((x.el -> 'events')::text) > 4194304 THEN 10
                   WHEN runrow._first_bad_event(x.el -> 'events') IS NOT NULL THEN 11
                   WHEN x.first < x.ord THEN 12
               END AS rule
        FROM (
            -- first: where this run_id first appears (a run given twice is an error).
            SELECT e.el, e.ord, min(e.ord) OVER (PARTITION BY lower(e.el ->> 'run_id')) AS first
            FROM jsonb_array_elements(_append_runs_input.runs) WITH ORDINALITY AS e (el, ord)
        ) AS x
    ) AS v
    WHERE v.rule IS NOT NULL
    ORDER BY v.i
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'runs[%]%', bad.i, CASE bad.rule
                WHEN 1 THEN format(' must be a JSON object, got %s', jsonb_typeof(bad.el))
                WHEN 2 THEN format(' has an unknown key %s (allowed: run_id, claim_token, events)',
                    (SELECT string_agg(format('"%s"', k.key), ', ')
                     FROM jsonb_object_keys(bad.el - ARRAY['run_id', 'claim_token', 'events']) AS k (key)))
                WHEN 3 THEN '.run_id must not be NULL'
                WHEN 4 THEN format('.run_id must be a UUID string, got %s', bad.el -> 'run_id')
                WHEN 5 THEN '.claim_token must not be NULL'
                WHEN 6 THEN format('.claim_token must be a UUID string, got %s', bad.el -> 'claim_token')
                WHEN 7 THEN '.events must not be NULL'
                WHEN 8 THEN format('.events must be a JSON array of event objects, got %s',
                    jsonb_typeof(bad.el -> 'events'))
                WHEN 9 THEN '.events must not be empty'
                WHEN 10 THEN '.events is too large: at most 1000 events and 4 MiB per run'
                WHEN 11 THEN format('.events[%s] must be an object with a non-empty string "type" that is not '
                    'reserved ("complete" and "run_*" are written by runrow itself) and has no control character',
                    runrow._first_bad_event(bad.el -> 'events'))
                ELSE format('.run_id %s is already runs[%s]: each run at most once per call', bad.el -> 'run_id',
                    bad.first)
            END
            USING ERRCODE = CASE WHEN bad.rule IN (3, 5, 7) THEN 'null_value_not_allowed' ELSE 'invalid_parameter_value' END;
    END IF;

    -- Valid after all (the fast pass's proof is sufficient, not necessary): nothing here raises.
    SELECT array_agg((x.el ->> 'run_id')::uuid) INTO ids
    FROM jsonb_array_elements(_append_runs_input.runs) AS x (el);
END
$fn$;

COMMENT ON FUNCTION runrow._append_runs_input(jsonb) IS
'Checks runs as append_runs_events documents it (a JSON array of at most 1000 objects {run_id, '
'claim_token, events}, each run at most once, each events array as append_events takes it) and '
'returns the elements'' run ids in input order (NULL for an empty array). '
'Bad input raises 22004/22023 naming the element index (runs[i]) and the field. Reads and writes '
'no table.';

REVOKE ALL ON FUNCTION runrow._append_runs_input(jsonb) FROM PUBLIC;
