-- runrow.tool_call_key: the documented derivation, vectors computed by pyworker/keys.py,
-- what canonical form means for key order, whitespace and numbers, bad input.
BEGIN;
\ir helpers/setup.psql
SELECT plan(17);

\set sig '''{uuid,integer,text,text,jsonb}'''
\set run '''0b1e6a4e-5c1f-4d0e-9a55-6f3c2d1e0a99'''
SELECT has_function('runrow', 'tool_call_key', :sig::name[], 'tool_call_key(run_id, step_seq, tool_use_id, tool, args) exists');
SELECT function_privs_are('runrow', 'tool_call_key', :sig::name[], 'runrow_worker', ARRAY['EXECUTE'], 'the worker computes keys');
SELECT function_privs_are('runrow', 'tool_call_key', :sig::name[], 'runrow_client', ARRAY['EXECUTE'], 'so may the client');
SELECT function_privs_are('runrow', 'tool_call_key', :sig::name[], 'public', ARRAY[]::name[], 'PUBLIC may not');

SELECT is(runrow.tool_call_key(:run, 7, 'toolu_01ABC', 'charge_card', '{"currency": "eur", "amount": 1250}'),
    encode(sha256(convert_to(:run || ':7:toolu_01ABC:charge_card:{"amount":1250,"currency":"eur"}', 'UTF8')), 'hex'),
    'the key is sha256 hex of run_id:step_seq:tool_use_id:tool:canonical(args)');
SELECT is(runrow.tool_call_key(:run, 7, 'toolu_01ABC', 'charge_card', '{"currency": "eur", "amount": 1250}'),
    'a10a85d20ca0cf7879be2a45dc65c5e1964642484a57be87a6ad73b75cb129ad', 'the vector pyworker/keys.py computes');
SELECT is(runrow.tool_call_key(:run, 1, 'tu', 't', '{"é": "日本", "a": [1, 2.5, null, true], "B": {"z": "\n\""}}'),
    '2a4c413a28558754e603cb84427e14e6c69cdb5dcfdc08cb9138452739761984', 'with unicode, escapes and nesting, too');
SELECT is(runrow._canonical_json('{"é": "日本", "a": [1, 2.5, null, true], "B": {"z": "\n\""}}'),
    '{"B":{"z":"\n\""},"a":[1,2.5,null,true],"é":"日本"}',
    'canonical: keys by code point (not jsonb''s length-first order), no whitespace, non-ASCII kept');
SELECT is(runrow.tool_call_key(:run, 1, 'tu', 't', '{"x": 100.0}'),
    'a9324cb179d1db81dd9b26bf5e137c1a52b046a9378adea101e06c63de839b54', 'a float keeps its scale: 100.0');
SELECT is(runrow.tool_call_key(:run, 1, 'tu', 't', '{"x": 1e2}'),
    '2c90cdb79ce93e2620888adf5ad3d595e6b4f61e657fa2d8a0519d2697d93fa6', 'an exponent is written out: 1e2 is 100');
SELECT is(runrow.tool_call_key(:run, 1, 'tu', 't', '{ "b" : 1 ,"a":2 }'), runrow.tool_call_key(:run, 1, 'tu', 't', '{"a":2,"b":1}'),
    'key order and whitespace of args do not matter');
SELECT isnt(runrow.tool_call_key(:run, 1, 'tu', 't', '{}'), runrow.tool_call_key(:run, 2, 'tu', 't', '{}'),
    'another step is another key');

SELECT throws_ok(format('SELECT runrow.tool_call_key(NULL, 1, ''tu'', ''t'', ''{}'')'), '22004', 'run_id must not be NULL', 'run_id NULL');
SELECT throws_ok(format('SELECT runrow.tool_call_key(%L, 0, ''tu'', ''t'', ''{}'')', :run), '22023',
    'step_seq must be between 1 and 2147483647, got 0', 'step_seq 0');
SELECT throws_ok(format('SELECT runrow.tool_call_key(%L, 1, '''', ''t'', ''{}'')', :run), '22023', 'tool_use_id must not be empty', 'an empty tool_use_id');
SELECT throws_ok(format('SELECT runrow.tool_call_key(%L, 1, ''tu'', NULL, ''{}'')', :run), '22004', 'tool must not be NULL', 'tool NULL');
SELECT throws_ok(format('SELECT runrow.tool_call_key(%L, 1, ''tu'', ''t'', ''[1]'')', :run), '22023',
    'args must be a JSON object (a tool_use block''s input), got array', 'args not an object');

SELECT * FROM finish();
ROLLBACK;
