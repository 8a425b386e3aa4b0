-- functions/_event_rules.sql: the journal writers' rule for caller events, read two ways.
-- _events_ok (inlined into the batch writers' fast pass) and _first_bad_event (the index their
-- exact pass names) agree on every case: a good array is TRUE / NULL, a bad one FALSE / the
-- 0-based index of its first bad event.
BEGIN;
\ir helpers/setup.psql
SELECT plan(4);

CREATE TEMP TABLE event_case (events jsonb, first_bad bigint, label text);
INSERT INTO event_case VALUES
    ('[{"type": "text_delta", "text": "a"}]', NULL, 'one event'),
    ('[{"type": "message_start"}, {"type": "message_stop", "x": [1]}]', NULL, 'two events'),
    ('[{"type": "runner"}, {"type": "completed"}]', NULL, 'types that only look reserved'),
    ('["text_delta"]', 0, 'not an object'),
    ('[{"type": "a"}, [{"type": "b"}]]', 1, 'an array in the array (not unwrapped)'),
    ('[{"type": "a"}, {"text": "no type"}]', 1, 'no type'),
    ('[{"type": 3}]', 0, 'a number for a type'),
    ('[{"type": ""}]', 0, 'an empty type'),
    ('[{"type": "a"}, {"type": "b"}, {"type": "complete"}]', 2, 'complete'),
    ('[{"type": "a"}, {"type": "run_claimed"}]', 1, 'run_*'),
    ('[{"type": ""}, {"text": "no type"}]', 0, 'the first of two bad events'),
    ('[{"type": "a"}, {"type": "comp\r\nlete"}]', 1, 'a line break in a type'),
    ('[{"type": "x\u0001"}]', 0, 'the lowest control character'),
    ('[{"type": "x\u001f"}, {"type": "y"}]', 0, 'the highest C0 control'),
    ('[{"type": "a"}, {"type": "x\u007f"}]', 1, 'DEL'),
    ('[{"type": "\u0080"}]', 0, 'the lowest C1 control'),
    ('[{"type": "x\u009fy"}]', 0, 'the highest C1 control'),
    ('[{"type": "x y\u00a0\u200b\u202e:é"}]', NULL, 'space, no-break space and format characters are not controls'),
    ('[{"type": "a", "text": "line\nbreak"}]', NULL, 'a control character in the payload is the payload''s');

SELECT is(
    (SELECT string_agg(c.label, '; ') FROM event_case AS c
     WHERE runrow._events_ok(c.events) IS DISTINCT FROM (c.first_bad IS NULL)),
    NULL, '_events_ok says TRUE for the good arrays and FALSE for the bad ones');
SELECT is(
    (SELECT string_agg(c.label, '; ') FROM event_case AS c
     WHERE runrow._first_bad_event(c.events) IS DISTINCT FROM c.first_bad),
    NULL, '_first_bad_event names the first bad event of each bad array, NULL for a good one');
SELECT is_empty($$SELECT p.oid::regprocedure FROM pg_proc AS p
    WHERE p.oid IN ('runrow._events_ok(jsonb)'::regprocedure, 'runrow._first_bad_event(jsonb)'::regprocedure)
      AND (p.prosecdef OR has_function_privilege('runrow_worker', p.oid, 'EXECUTE')
           OR has_function_privilege('runrow_client', p.oid, 'EXECUTE'))$$,
    'neither is SECURITY DEFINER or callable by a runrow role');
-- Inlined: a plan that uses _events_ok shows its jsonpaths, not a call.
CREATE FUNCTION pg_temp.plan_text(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    line text;
    plan text := '';
BEGIN
    FOR line IN EXECUTE 'EXPLAIN (VERBOSE, COSTS OFF) ' || q LOOP
        plan := plan || line || E'\n';
    END LOOP;
    RETURN plan;
END
$$;
SELECT unalike(pg_temp.plan_text($$SELECT runrow._events_ok(e.events) FROM event_case AS e$$),
    '%_events_ok%', '_events_ok is inlined into the statement that uses it (no call per event array)');

SELECT * FROM finish();
ROLLBACK;
