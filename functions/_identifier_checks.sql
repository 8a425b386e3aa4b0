-- Identifiers a caller names (a model, user_id, a fairness, concurrency or rate-limit key, a
-- schedule's name, a worker_id, a tool, decided_by, a webhook URL) are read back by operators:
-- in log lines, `runrow status`, Prometheus labels, the HTTP service and the chat page. A control
-- character in one forges what they read: a fairness_key of "acme\n2026-12-07 ERROR ..." wrote a
-- log line of its own, a right-to-left override (U+202E) showed `runrow status` another tenant.
-- They are refused where they are named (22023 naming the argument, nothing written), and the
-- tables that keep them refuse them too (migration 0085). Free text (a turn's content, a reason,
-- an error) is not an identifier and keeps them.

-- TRUE when value holds none of the characters no identifier may hold; NULL for NULL. Written
-- here once, as one bracket expression of the regular expression engine: C0 controls
-- (U+0001-U+001F; NUL cannot be in text), DEL and the C1 controls (U+007F-U+009F), the line and
-- paragraph separators (U+2028, U+2029: Python's splitlines and JavaScript break a line there),
-- and the bidirectional formatting characters (U+061C, U+200E, U+200F, U+202A-U+202E,
-- U+2066-U+2069). One expression, inlined into the caller's test (no call, the pattern a
-- constant the engine's cache compiles once per session): about 0.2 us on a short key (100,000
-- tests of a 15-character key: 26.6 ms against 9.4 ms for `<> ''`). Migration 0085 defines it
-- first: its triggers call it from their first row on, before functions/ is applied.
CREATE OR REPLACE FUNCTION runrow._printable(value text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT value !~ E'[\u0001-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]'
$fn$;

-- Raises 22023 naming arg unless _printable(value) (NULL passes). The message names the
-- character by its code point and position, and does not quote the value: quoted, the line
-- break or override would reach the log through the error itself.
CREATE OR REPLACE FUNCTION runrow._require_printable(value text, arg text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $fn$
DECLARE
    bad text;
    pos integer;
BEGIN
    IF runrow._printable(value) IS FALSE THEN
        -- The first character _printable refuses (an error path: one test a character).
        FOR i IN 1..length(value) LOOP
            bad := substr(value, i, 1);
            pos := i;
            EXIT WHEN NOT runrow._printable(bad);
        END LOOP;
        RAISE EXCEPTION '% must not hold control characters (C0, C1 or bidirectional formatting), '
            'got U+% at character %', arg, lpad(upper(to_hex(ascii(bad))), 4, '0'), pos
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

COMMENT ON FUNCTION runrow._printable(text) IS
'Private. TRUE when value holds no C0 control (U+0001-U+001F), DEL or C1 control '
'(U+007F-U+009F), line or paragraph separator (U+2028, U+2029) or bidirectional formatting '
'character (U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069); NULL for NULL. The one place '
'the class is written. Inlined into the callers'' tests; _require_printable raises.';

COMMENT ON FUNCTION runrow._require_printable(text, text) IS
'Private. Raises 22023 "<arg> must not hold control characters (C0, C1 or bidirectional '
'formatting), got U+XXXX at character N" unless _printable(value); NULL passes. The value itself '
'is not quoted, so the character does not reach a log through the error.';

REVOKE ALL ON FUNCTION runrow._printable(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._require_printable(text, text) FROM PUBLIC;
