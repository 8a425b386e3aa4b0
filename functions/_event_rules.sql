-- The rule every journal writer applies to the events a caller appends: each an object with a
-- non-empty string "type" that is not reserved ("complete" and "run_*" are written by runrow
-- itself) and holds no control character (C0, DEL, C1: a type is an SSE event name and a line of
-- `runrow tail`, where a line break forges a frame and an escape rewrites a terminal). Caller
-- events reach the journal only through these writers (no runrow role may INSERT into
-- run_event), so the rule holds for every client; runrow's own types are constants. The journal
-- guard does not test it again: a regular expression per row costs about 3,000 instructions, and
-- every journal row (claims, endings) would pay it for the owner's sake alone. One definition for the batch writers' checks (_append_runs_input,
-- _finish_runs_input); append_events keeps the rule in its own statement, which costs it no
-- function call on every append.

-- TRUE when every event of the array keeps the rule. One SQL expression, so the planner inlines
-- it into the statement of its caller's fast pass (no call): strict, so that an array in the
-- array is not unwrapped into its elements; lax for the type, where a missing type is an empty
-- sequence that fails the test rather than an error.
CREATE OR REPLACE FUNCTION runrow._events_ok(events jsonb)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT NOT jsonb_path_exists(events, 'strict $[*] ? (@.type() != "object")')
        AND NOT jsonb_path_exists(
            events,
            'lax $[*] ? (!(@.type.type() == "string") || @.type == "" || @.type == "complete"'
            ' || @.type starts with "run_" || @.type like_regex "[\u0001-\u001f\u007f-\u009f]")'
        )
$fn$;

-- The 0-based index of the first event of the array that breaks the rule, NULL if none does:
-- for the exact passes that name it (events[i]), which run only on bad input.
CREATE OR REPLACE FUNCTION runrow._first_bad_event(events jsonb)
RETURNS bigint
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT min(e.ord) - 1
    FROM jsonb_array_elements(events) WITH ORDINALITY AS e (ev, ord)
    WHERE jsonb_typeof(e.ev) <> 'object'
       OR jsonb_typeof(e.ev -> 'type') IS DISTINCT FROM 'string'
       OR e.ev ->> 'type' = ''
       OR e.ev ->> 'type' = 'complete'
       OR e.ev ->> 'type' LIKE 'run\_%'
       OR e.ev ->> 'type' ~ '[\u0001-\u001f\u007f-\u009f]'
$fn$;

COMMENT ON FUNCTION runrow._events_ok(jsonb) IS
'TRUE when every element of the JSON array events is an object with a non-empty string type '
'that is neither complete nor run_* and has no control character (U+0001-U+001F, U+007F-U+009F; '
'the journal writers'' rule for caller events). Inlined into its callers'' statements.';

COMMENT ON FUNCTION runrow._first_bad_event(jsonb) IS
'The 0-based index of the first element of the JSON array events that breaks the journal '
'writers'' rule (an object with a non-empty string type, not complete, not run_*, without a '
'control character), NULL if none does. For error messages (events[i]).';

REVOKE ALL ON FUNCTION runrow._events_ok(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._first_bad_event(jsonb) FROM PUBLIC;
