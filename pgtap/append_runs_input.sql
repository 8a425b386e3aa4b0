-- runrow._append_runs_input: the input check of append_runs_events. It returns the elements'
-- run ids in input order, raises on bad input naming the element and the field, and reads and
-- writes no table. Its fast pass proves an element valid with fewer tests than the exact pass
-- has rules; inputs made to slip through such a proof are refused with the exact pass's error.
-- The message of every rule is pinned in pgtap/append_runs_events.sql, through the public function.
BEGIN;
\ir helpers/setup.psql
\ir helpers/row_versions.psql
SELECT plan(16);

\set sig '''{jsonb}'''
SELECT has_function('runrow', '_append_runs_input', :sig::name[], '_append_runs_input(runs) exists');
SELECT isnt_definer('runrow', '_append_runs_input', :sig::name[], 'it runs as its caller');
SELECT is((SELECT proconfig FROM pg_proc WHERE oid = 'runrow._append_runs_input(jsonb)'::regprocedure),
    NULL, 'it carries no SET clauses (it reads no table; its caller pins the search_path)');
SELECT isnt(obj_description('runrow._append_runs_input(jsonb)'::regprocedure, 'pg_proc'), NULL,
    'it has a COMMENT stating its contract');

\set a '''0190a0a0-0000-7000-8000-00000000000a'''
\set b '''0190A0A0-0000-7000-8000-00000000000B'''
SELECT jsonb_build_array(
    jsonb_build_object('run_id', :a, 'claim_token', gen_random_uuid(), 'events', '[{"type": "text_delta", "text": "x"}]'::jsonb),
    jsonb_build_object('run_id', :b, 'claim_token', gen_random_uuid(), 'events', '[{"type": "x"}, {"type": "y"}]'::jsonb))
    AS runs \gset
SELECT pg_temp.written() AS before \gset
SELECT is(runrow._append_runs_input(:'runs'), ARRAY[:a, :b]::uuid[], 'the ids, in input order');
SELECT is((runrow._append_runs_input(:'runs'))[2]::text, lower(:b), 'a UUID in capitals is the same uuid');
SELECT is(runrow._append_runs_input('[]'), NULL::uuid[], 'an empty array: NULL (no rows for the caller)');

\set el0 '(:''runs''::jsonb -> 0)'
\set event_msg 'runs[0].events[%s] must be an object with a non-empty string "type" that is not reserved ("complete" and "run_*" are written by runrow itself) and has no control character'
SELECT throws_ok(format('SELECT runrow._append_runs_input(%L)', jsonb_build_array(
        jsonb_set(:el0, '{run_id}', '["aaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaa"]'))),
    '22023', 'runs[0].run_id must be a UUID string, got ["aaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaa"]',
    'a run_id that is an array whose text has the UUID''s shape');
SELECT replace(gen_random_uuid()::text, '-', '') AS bare_token \gset
SELECT throws_ok(format('SELECT runrow._append_runs_input(%L)', jsonb_build_array(
        jsonb_set(:el0, '{claim_token}', to_jsonb(:'bare_token'::text)))),
    '22023', format('runs[0].claim_token must be a UUID string, got "%s"', :'bare_token'),
    'a claim_token the uuid cast takes but the canonical shape does not (no hyphens)');
SELECT throws_ok(format('SELECT runrow._append_runs_input(%L)', '[5]'),
    '22023', 'runs[0] must be a JSON object, got number', 'an element that is a number (an operator raises)');
SELECT throws_ok(format('SELECT runrow._append_runs_input(%L)', jsonb_build_array(
        jsonb_set(:el0, '{events}', '[{"type": "text"}, [{"type": "text"}]]'))),
    '22023', format(:'event_msg', 1), 'an event that is an array of a valid event');
SELECT throws_ok(format('SELECT runrow._append_runs_input(%L)', jsonb_build_array(
        jsonb_set(:el0, '{events}', '[{"type": ["text"]}]'))),
    '22023', format(:'event_msg', 0), 'an event whose type is an array of a string');
SELECT throws_ok(format('SELECT runrow._append_runs_input(%L)', jsonb_build_array(
        jsonb_set(:el0, '{events}', 'null'))),
    '22004', 'runs[0].events must not be NULL', 'a JSON null for events (append_events takes none either)');
-- The first bad element is reported, whichever rule it breaks: a run given twice is bad at its
-- second element, and only where no element before it broke another rule.
SELECT throws_ok(format('SELECT runrow._append_runs_input(%L)',
        jsonb_build_array(:el0, :el0, jsonb_set(:'runs'::jsonb -> 1, '{events}', '[]'))),
    '22023', format('runs[1].run_id "%s" is already runs[0]: each run at most once per call', :a),
    'a run twice before a broken rule: the repeat is reported');
SELECT throws_ok(format('SELECT runrow._append_runs_input(%L)',
        jsonb_build_array(jsonb_set(:'runs'::jsonb -> 1, '{events}', '[]'), :el0, :el0)),
    '22023', 'runs[0].events must not be empty', 'a broken rule before a run''s repeat: the broken rule is reported');
SELECT is(pg_temp.written(), :'before', 'nothing written, good input or bad');

SELECT * FROM finish();
ROLLBACK;
