-- runrow.events_channel: the per-run NOTIFY channel is runrow_events_ + the run id as
-- 32 lowercase hex digits, a plain identifier LISTEN takes unquoted.
BEGIN;
\ir helpers/setup.psql
SELECT plan(14);

SELECT has_function('runrow', 'events_channel', ARRAY['uuid'], 'events_channel(run_id) exists');
SELECT function_returns('runrow', 'events_channel', ARRAY['uuid'], 'text', 'and returns text');
SELECT volatility_is('runrow', 'events_channel', ARRAY['uuid'], 'immutable', 'it is immutable: a pure name');
SELECT function_privs_are('runrow', 'events_channel', ARRAY['uuid'], 'runrow_worker', ARRAY['EXECUTE'],
    'runrow_worker may compute it');
SELECT function_privs_are('runrow', 'events_channel', ARRAY['uuid'], 'runrow_client', ARRAY['EXECUTE'],
    'runrow_client may compute it');
SELECT function_privs_are('runrow', 'events_channel', ARRAY['uuid'], 'runrow_auditor', ARRAY['EXECUTE'],
    'runrow_auditor may compute it');
SELECT function_privs_are('runrow', 'events_channel', ARRAY['uuid'], 'public', ARRAY[]::name[],
    'PUBLIC may not');

SELECT is(runrow.events_channel('0123abcd-4567-89ef-0123-456789abcdef'),
    'runrow_events_0123abcd456789ef0123456789abcdef', 'the prefix and the run id without dashes');
SELECT is(runrow.events_channel('0123ABCD-4567-89EF-0123-456789ABCDEF'),
    'runrow_events_0123abcd456789ef0123456789abcdef', 'hex digits are lowercase whatever the input spelling');
SELECT is(
    (SELECT count(*)::int FROM generate_series(1, 200),
        LATERAL (SELECT runrow.events_channel(gen_random_uuid()) AS ch) AS x
     WHERE x.ch ~ '^runrow_events_[0-9a-f]{32}$' AND length(x.ch) = 46),
    200, 'every channel is runrow_events_ followed by exactly 32 hex digits');
SELECT ok(length(runrow.events_channel(gen_random_uuid())) <= 63,
    'it fits PostgreSQL''s 63-byte identifier limit, so it is never truncated');

SET LOCAL ROLE runrow_client;
SELECT is(runrow.events_channel('00000000-0000-0000-0000-000000000001'),
    'runrow_events_00000000000000000000000000000001', 'a client computes the same name');
RESET ROLE;
-- LISTEN accepts it unquoted (it is a plain lowercase identifier).
SELECT lives_ok(format('LISTEN %s', runrow.events_channel(gen_random_uuid())), 'LISTEN takes it unquoted');
UNLISTEN *;

SELECT throws_ok('SELECT runrow.events_channel(NULL)', '22004', 'run_id must not be NULL', 'run_id NULL');

SELECT * FROM finish();
ROLLBACK;
