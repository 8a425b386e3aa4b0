-- runrow._uuidv7: the time-ordered default of agent_run.id and message.id. Version 7 and the
-- RFC variant, the millisecond of now() in front (so ids of later transactions sort after
-- earlier ones), distinct ids. It takes no argument and writes nothing: no bad input, no fence.
BEGIN;
\ir helpers/setup.psql
SELECT plan(10);

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

SELECT * FROM finish();
ROLLBACK;
