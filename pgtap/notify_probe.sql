-- runrow.notify_probe: the hub's wake self-test NOTIFYs only runrow_probe_ channels, with
-- the channel as payload, writes no row, and names its argument on bad input.
BEGIN;
\ir helpers/setup.psql
SELECT plan(13);

SELECT has_function('runrow', 'notify_probe', ARRAY['text'], 'notify_probe(channel) exists');
SELECT function_returns('runrow', 'notify_probe', ARRAY['text'], 'text', 'and returns text');
SELECT function_privs_are('runrow', 'notify_probe', ARRAY['text'], 'runrow_worker', ARRAY['EXECUTE'],
    'runrow_worker may probe (runrow worker''s hub)');
SELECT function_privs_are('runrow', 'notify_probe', ARRAY['text'], 'runrow_client', ARRAY['EXECUTE'],
    'runrow_client may probe (runrow serve''s hub)');
SELECT function_privs_are('runrow', 'notify_probe', ARRAY['text'], 'runrow_auditor', ARRAY[]::name[],
    'runrow_auditor may not');
SELECT function_privs_are('runrow', 'notify_probe', ARRAY['text'], 'public', ARRAY[]::name[],
    'PUBLIC may not');

-- Happy path: the channel comes back, and nothing is written.
SELECT pg_temp.new_run();
SELECT pg_temp.fingerprint() AS before \gset
SELECT is(runrow.notify_probe('runrow_probe_0123456789abcdef0123456789abcdef'),
    'runrow_probe_0123456789abcdef0123456789abcdef', 'it returns the channel it notified');
SELECT is(pg_temp.fingerprint(), :'before', 'and writes no row');

-- Not a fence, but the same boundary: a caller cannot wake the queue or a run's tails with it.
SELECT throws_ok($$SELECT runrow.notify_probe('runrow_enqueued')$$, '22023',
    'channel must be runrow_probe_ followed by 32 lowercase hex digits, got runrow_enqueued',
    'the queue''s channel is refused');
SELECT throws_ok(format('SELECT runrow.notify_probe(%L)', runrow.events_channel(gen_random_uuid())), '22023',
    NULL, 'a run''s journal channel is refused');
SELECT throws_ok($$SELECT runrow.notify_probe('runrow_probe_0123456789ABCDEF0123456789ABCDEF')$$, '22023',
    NULL, 'upper-case hex is refused (LISTEN folds an unquoted name to lower case)');

-- Bad input.
SELECT throws_ok('SELECT runrow.notify_probe(NULL)', '22004', 'channel must not be NULL', 'channel NULL');
SELECT is(pg_temp.fingerprint(), :'before', 'bad input wrote nothing');

SELECT * FROM finish();
ROLLBACK;
