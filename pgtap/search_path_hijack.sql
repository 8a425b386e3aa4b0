-- A caller cannot run its own code as the schema owner by shadowing a pg_catalog type with a
-- temporary one. Every function that pins its search_path names pg_temp last: left out, pg_temp
-- is searched first for tables and types, so a caller's temporary table `text` shadowed
-- pg_catalog.text inside a SECURITY DEFINER function, and a cast the caller made from jsonb to
-- it ran as the owner (the security audit: a runrow_worker login made itself CREATEROLE through
-- append_events; a runrow_client login read every claim token through enqueue_run).
BEGIN;
\ir helpers/setup.psql
SELECT plan(4);

CREATE FUNCTION pg_temp.attempt(who name, call pg_catalog.text) RETURNS pg_catalog.text
LANGUAGE plpgsql AS $attempt$
DECLARE
    outcome pg_catalog.text;
BEGIN
    EXECUTE pg_catalog.format('SET LOCAL ROLE %I', who);
    -- The shadow: a temporary table named text is a type pg_temp.text, and its owner may
    -- define a cast to it; the cast's function raises, naming the role it runs as. Before the
    -- fix the shadow reached inside the functions (the call failed on octet_length(pg_temp.text),
    -- or with the audit's implicit cast back, ran the caller's code as the owner); now the call
    -- behaves as without it.
    CREATE TEMP TABLE text (x int);
    CREATE FUNCTION pg_temp.evil(pg_catalog.jsonb) RETURNS pg_temp.text LANGUAGE plpgsql AS $evil$
    BEGIN
        RAISE EXCEPTION 'the caller''s code ran as %', current_user;
    END
    $evil$;
    CREATE CAST (pg_catalog.jsonb AS pg_temp.text) WITH FUNCTION pg_temp.evil(pg_catalog.jsonb);
    BEGIN
        EXECUTE call;
        outcome := 'no code of the caller ran';
    EXCEPTION WHEN OTHERS THEN
        outcome := SQLERRM;
    END;
    DROP TABLE pg_temp.text CASCADE;  -- and the cast and function with it: pgTAP says text
    RESET ROLE;
    RETURN outcome;
END
$attempt$;

SELECT is(pg_temp.attempt('runrow_worker',
        $$SELECT runrow.append_events(gen_random_uuid(), gen_random_uuid(), '[{"type": "x"}]')$$),
    'no code of the caller ran', 'runrow_worker: append_events is not hijacked');
SELECT is(pg_temp.attempt('runrow_client',
        $$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"hi"', 'm')$$),
    'no code of the caller ran', 'runrow_client: enqueue_run is not hijacked');

-- Every function that pins a search_path ends it with pg_temp.
SELECT is_empty($$SELECT p.oid::regprocedure FROM pg_proc AS p, unnest(p.proconfig) AS c (setting)
    WHERE p.pronamespace = 'runrow'::regnamespace AND c.setting LIKE 'search\_path=%'
      AND c.setting <> 'search_path=pg_catalog, runrow, pg_temp'$$,
    'every search_path in runrow is pg_catalog, runrow, pg_temp');
SELECT is_empty($$SELECT p.oid::regprocedure FROM pg_proc AS p
    WHERE p.pronamespace = 'runrow'::regnamespace AND p.prosecdef
      AND NOT 'search_path=pg_catalog, runrow, pg_temp' = ANY (coalesce(p.proconfig, '{}'))$$,
    'every SECURITY DEFINER function pins it');

SELECT * FROM finish();
ROLLBACK;
