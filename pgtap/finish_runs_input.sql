-- runrow._finish_runs_input: the input check shared by finish_runs and finish_and_claim_runs.
-- It returns the elements' fields as parallel arrays in input order (what the callers' UPDATE
-- joins to agent_run as rows), raises on bad input naming the element
-- and the field, and reads and writes no table. The messages of each rule are pinned in
-- pgtap/finish_runs.sql, through the public function.
BEGIN;
\ir helpers/setup.psql
\ir helpers/row_versions.psql
SELECT plan(31);

\set sig '''{jsonb}'''
SELECT has_function('runrow', '_finish_runs_input', :sig::name[], '_finish_runs_input(runs) exists');
SELECT isnt_definer('runrow', '_finish_runs_input', :sig::name[], 'it runs as its caller');
SELECT is((SELECT proconfig FROM pg_proc WHERE oid = 'runrow._finish_runs_input(jsonb)'::regprocedure),
    NULL, 'it carries no SET clauses (it reads no table; its callers pin the search_path)');
SELECT isnt(obj_description('runrow._finish_runs_input(jsonb)'::regprocedure, 'pg_proc'), NULL,
    'it has a COMMENT stating its contract');

\set a '''0190a0a0-0000-7000-8000-00000000000a'''
\set b '''0190A0A0-0000-7000-8000-00000000000B'''
SELECT jsonb_build_array(
    jsonb_build_object('run_id', :a, 'claim_token', gen_random_uuid(), 'status', 'completed',
        'events', '[{"type": "text_delta", "text": "x"}]'::jsonb),
    jsonb_build_object('run_id', :b, 'claim_token', gen_random_uuid(), 'status', 'failed', 'error', 'e')) AS runs \gset
CREATE TEMP TABLE parsed AS SELECT * FROM runrow._finish_runs_input(:'runs');
SELECT is((SELECT ids FROM parsed), ARRAY[:a, :b]::uuid[], 'the ids, in input order');
SELECT is((SELECT ids[2]::text FROM parsed), lower(:b), 'a UUID in capitals is the same uuid');
SELECT is((SELECT tokens FROM parsed),
    ARRAY[(:'runs'::jsonb -> 0 ->> 'claim_token')::uuid, (:'runs'::jsonb -> 1 ->> 'claim_token')::uuid],
    'the claim tokens, in input order');
SELECT is((SELECT statuses FROM parsed), ARRAY['completed', 'failed'], 'the statuses, in input order');
SELECT is((SELECT errors FROM parsed), ARRAY[NULL, 'e'], 'the errors: an absent one is NULL');
SELECT is((SELECT events FROM parsed), ARRAY['[{"type": "text_delta", "text": "x"}]'::jsonb, NULL],
    'the events arrays, as given: absent is NULL');
SELECT is((SELECT results FROM runrow._finish_runs_input(jsonb_build_array(
        jsonb_set(:'runs'::jsonb -> 0, '{result}', '{"ok": 1}'),
        jsonb_set(:'runs'::jsonb -> 1, '{result}', 'null')))),
    ARRAY['{"ok": 1}'::jsonb, NULL], 'the results: a JSON null is NULL');
SELECT is((SELECT (ids, tokens, statuses, results, errors, events)::text FROM runrow._finish_runs_input('[]')),
    '(,,,,,)', 'an empty array: every array NULL (which the callers'' unnest takes as no rows)');

SELECT pg_temp.written() AS before \gset
SELECT throws_ok('SELECT * FROM runrow._finish_runs_input(NULL)', '22004', 'runs must not be NULL', 'runs NULL');
SELECT throws_ok(format('SELECT * FROM runrow._finish_runs_input(%L)', jsonb_build_array(:'runs'::jsonb -> 0, :'runs'::jsonb -> 0)),
    '22023', format('runs[1].run_id "%s" is already runs[0]: each run at most once per call', :a),
    'a run twice, named by both indexes');
-- The first bad element is reported, whichever rule it breaks: a run given twice is bad at its
-- second element, and only where no element before it broke another rule.
SELECT jsonb_set(:'runs'::jsonb -> 0, '{status}', '"done"') AS broken \gset
SELECT throws_ok(format('SELECT * FROM runrow._finish_runs_input(%L)',
        jsonb_build_array(:'runs'::jsonb -> 0, :'runs'::jsonb -> 0, :'runs'::jsonb -> 1, :'broken'::jsonb)),
    '22023', format('runs[1].run_id "%s" is already runs[0]: each run at most once per call', :a),
    'a run twice before a broken rule: the repeat is reported');
SELECT throws_ok(format('SELECT * FROM runrow._finish_runs_input(%L)',
        jsonb_build_array(:'runs'::jsonb -> 1, :'broken'::jsonb, :'runs'::jsonb -> 0)),
    '22023', 'runs[1].status must be one of completed, failed, cancelled, got "done"',
    'a broken rule before a run''s repeat: the broken rule is reported');
SELECT throws_ok(format('SELECT * FROM runrow._finish_runs_input(%L)',
        jsonb_build_array(:'broken'::jsonb, :'runs'::jsonb -> 0)),
    '22023', 'runs[0].status must be one of completed, failed, cancelled, got "done"',
    'an element that breaks a rule and is repeated later: its own rule is reported');

-- The fast pass proves an element valid with fewer tests than the exact pass has rules (the
-- LIKE of the UUID's shape and the cast stand for "a string, a canonical UUID"; jsonpath for
-- the events). Inputs made to slip through such a proof are refused with the exact pass's error.
\set el0 '(:''runs''::jsonb -> 0)'
\set event_msg 'runs[0].events[%s] must be an object with a non-empty string "type" that is not reserved ("complete" and "run_*" are written by runrow itself) and has no control character'
SELECT throws_ok(format('SELECT * FROM runrow._finish_runs_input(%L)', jsonb_build_array(
        jsonb_set(:el0, '{run_id}', '["aaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaa"]'))),
    '22023', 'runs[0].run_id must be a UUID string, got ["aaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaa"]',
    'a run_id that is an array whose text has the UUID''s shape');
SELECT replace(gen_random_uuid()::text, '-', '') AS bare_token \gset
SELECT throws_ok(format('SELECT * FROM runrow._finish_runs_input(%L)', jsonb_build_array(
        jsonb_set(:el0, '{claim_token}', to_jsonb(:'bare_token'::text)))),
    '22023', format('runs[0].claim_token must be a UUID string, got "%s"', :'bare_token'),
    'a claim_token the uuid cast takes but the canonical shape does not (no hyphens)');
SELECT throws_ok(format('SELECT * FROM runrow._finish_runs_input(%L)', jsonb_build_array(
        jsonb_set(:el0, '{status}', '["completed"]'))),
    '22023', 'runs[0].status must be one of completed, failed, cancelled, got ["completed"]',
    'a status that is an array of a valid one');
SELECT throws_ok(format('SELECT * FROM runrow._finish_runs_input(%L)', '[5]'),
    '22023', 'runs[0] must be a JSON object, got number', 'an element that is a number (an operator raises)');
SELECT throws_ok(format('SELECT * FROM runrow._finish_runs_input(%L)', jsonb_build_array(
        jsonb_set(:el0, '{error}', '42'))),
    '22023', 'runs[0].error must be a string or null, got number', 'an error that is a number');
SELECT throws_ok(format('SELECT * FROM runrow._finish_runs_input(%L)', jsonb_build_array(
        jsonb_set(:el0, '{events}', '{"type": "text"}'))),
    '22023', 'runs[0].events must be a JSON array of event objects, got object', 'events that are one object');
SELECT throws_ok(format('SELECT * FROM runrow._finish_runs_input(%L)', jsonb_build_array(
        jsonb_set(:el0, '{events}', '[{"type": "text"}, [{"type": "text"}]]'))),
    '22023', format(:'event_msg', 1), 'an event that is an array of a valid event');
SELECT throws_ok(format('SELECT * FROM runrow._finish_runs_input(%L)', jsonb_build_array(
        jsonb_set(:el0, '{events}', '[{"type": ["text"]}]'))),
    '22023', format(:'event_msg', 0), 'an event whose type is an array of a string');
SELECT throws_ok(format('SELECT * FROM runrow._finish_runs_input(%L)', jsonb_build_array(
        jsonb_set(:el0, '{events}', '[{"text": "x"}]'))),
    '22023', format(:'event_msg', 0), 'an event without a type');
SELECT throws_ok(format('SELECT * FROM runrow._finish_runs_input(%L)', jsonb_build_array(
        jsonb_set(:el0, '{events}', '[{"type": "run_claimed"}]'))),
    '22023', format(:'event_msg', 0), 'an event of a reserved type');
SELECT throws_ok(format('SELECT * FROM runrow._finish_runs_input(%L)', jsonb_build_array(
        :el0, jsonb_set(:'runs'::jsonb -> 1, '{run_id}', to_jsonb(upper(:a))))),
    '22023', format('runs[1].run_id "%s" is already runs[0]: each run at most once per call', upper(:a)),
    'a run twice, once in capitals');
SELECT is((SELECT (results, errors, events)::text FROM runrow._finish_runs_input(jsonb_build_array(
        :el0 || '{"result": null, "error": null, "events": null}'))),
    '({NULL},{NULL},{NULL})', 'JSON nulls for result, error and events are valid, and NULL');
SELECT is((SELECT events FROM runrow._finish_runs_input(jsonb_build_array(
        :el0 || '{"events": [{"type": "message_start"}, {"type": "text", "text": "hi"}, {"type": "message_stop"}]}'))),
    ARRAY['[{"type": "message_start"}, {"type": "text", "text": "hi"}, {"type": "message_stop"}]'::jsonb],
    'a worker''s events are valid, and kept as given');
SELECT is(pg_temp.written(), :'before', 'nothing written, good input or bad');

SELECT * FROM finish();
ROLLBACK;
