-- runrow._uuidv7: the time-ordered default of agent_run.id and message.id. Version 7 and the
-- RFC variant, the millisecond of now() in front (so ids of later transactions sort after
-- earlier ones), distinct ids. It takes no argument and writes nothing: no bad input, no fence.
BEGIN;
\ir helpers/setup.psql
SELECT plan(15);

SELECT has_function('runrow', '_uuidv7', ARRAY[]::name[], '_uuidv7() exists');
SELECT function_returns('runrow', '_uuidv7', ARRAY[]::name[], 'uuid', 'and returns uuid');
SELECT function_privs_are('runrow', '_uuidv7', ARRAY[]::name[], 'public', ARRAY[]::name[],
    'PUBLIC may not call it');
SELECT isnt(obj_description('runrow._uuidv7()'::regprocedure, 'pg_proc'), NULL,
    '_uuidv7 has a COMMENT stating its contract');

SELECT is(substr(runrow._uuidv7()::text, 15, 1), '7', 'the version nibble is 7');
SELECT ok(substr(runrow._uuidv7()::text, 20, 1) IN ('8', '9', 'a', 'b'), 'the variant is RFC 9562''s');
SELECT is(
    ('x' || translate(substr(runrow._uuidv7()::text, 1, 13), '-', ''))::bit(48)::bigint,
    floor(extract(EPOCH FROM now()) * 1000)::bigint,
    'the first 48 bits are the millisecond of now()'
);
SELECT is((SELECT count(DISTINCT runrow._uuidv7()) FROM generate_series(1, 1000)), 1000::bigint,
    'a thousand ids in one transaction are distinct');

SELECT is(
    (SELECT column_default FROM information_schema.columns
     WHERE table_schema = 'runrow' AND table_name = 'agent_run' AND column_name = 'id'),
    'runrow._uuidv7()',
    'agent_run.id defaults to a UUIDv7'
);
SELECT is(
    (SELECT column_default FROM information_schema.columns
     WHERE table_schema = 'runrow' AND table_name = 'message' AND column_name = 'id'),
    'runrow._uuidv7()',
    'message.id defaults to a UUIDv7'
);

-- Inlined (migration 0055): no SET clause, a standard body bound when it was created, so the
-- planner puts its expression in place of the call, and a caller's search_path cannot take over
-- a name in it.
SELECT ok((SELECT p.proconfig IS NULL AND p.prosqlbody IS NOT NULL FROM pg_proc AS p
    WHERE p.oid = 'runrow._uuidv7()'::regprocedure), 'no SET clause, and a body bound at creation');
CREATE FUNCTION pg_temp.plan_of(query text) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    line text;
    plan text := '';
BEGIN
    FOR line IN EXECUTE 'EXPLAIN (VERBOSE, COSTS OFF) ' || query LOOP
        plan := plan || line || E'\n';
    END LOOP;
    RETURN plan;
END
$fn$;
SELECT unalike(pg_temp.plan_of('SELECT runrow._uuidv7()'), '%_uuidv7%', 'a call is inlined');
SELECT alike(
    pg_temp.plan_of($$INSERT INTO runrow.message (conversation_id, content) VALUES (gen_random_uuid(), '"x"')$$),
    '%set_bit(set_bit(%gen_random_uuid()%', 'so is message.id''s default in an INSERT''s plan');
CREATE SCHEMA evil;
CREATE FUNCTION evil.gen_random_uuid() RETURNS uuid LANGUAGE sql AS $$ SELECT '00000000-0000-4000-8000-000000000000'::uuid $$;
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT 'epoch'::timestamptz $$;
SET LOCAL search_path = evil, pg_catalog, public;
SELECT count(DISTINCT runrow._uuidv7()) AS distinct_ids, min(substr(runrow._uuidv7()::text, 1, 8)) AS first_bits
FROM generate_series(1, 100) \gset
SET LOCAL search_path = tap, public;
SELECT is(:distinct_ids::bigint, 100::bigint,
    'a search_path that puts another gen_random_uuid first does not reach it');
SELECT isnt(:'first_bits'::text, '00000000', 'nor another now()');

SELECT * FROM finish();
ROLLBACK;
