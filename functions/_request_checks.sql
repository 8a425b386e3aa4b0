-- The checks of a turn's request that would otherwise fail later, on every attempt: JSON that
-- clients cannot read back (_json_portable), the run's metadata, and what the Messages API would
-- refuse one attempt too late: a user turn's content blocks and the run's tool definitions.
-- What the API refuses here
-- it refuses every time (a 400), so a run enqueued with it could only fail once, after being
-- claimed, leased and paid for in a worker's slot; the caller is told now instead, and nothing
-- is written. Only rules that hold for any conversation are checked (a tool_result's pairing
-- with the model's tool_use depends on the history, and is the API's), and a block type runrow
-- does not know passes, so that a new kind of block needs no new runrow.

-- White space, for every rule of runrow that speaks of it: Unicode's White_Space property, the
-- characters btrim(x, runrow._white_space()) removes. A turn of only these is refused (the API:
-- "text content blocks must contain non-whitespace text"), a model, a schedule's name may not
-- begin or end with one, a decided_by or a defer reason may not be only these. It was ASCII's
-- six, with a no-break space added for models alone, and other rules used btrim's default (the
-- space) or a regular expression's [[:space:]] (the locale's, which in C.UTF-8 leaves out the
-- no-break space): a lone U+00A0 named the person who approved an irreversible call (the SQL
-- audit). One constant, folded into every statement that uses it (UTF-8 databases).
CREATE OR REPLACE FUNCTION runrow._white_space()
RETURNS text
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT E' \t\n\r\x0b\f\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a'
        '\u2028\u2029\u202f\u205f\u3000'
$fn$;

-- TRUE when model neither begins nor ends with white space (_white_space): a pasted
-- "claude-x " was enqueued and failed at the API (404) once claimed and paid for in a worker's
-- slot. NULL for NULL. Inlined; _require_model_trimmed says what is wrong.
CREATE OR REPLACE FUNCTION runrow._model_trimmed(model text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT btrim(model, runrow._white_space()) = model
$fn$;

-- Raises 22023 naming model unless _model_trimmed(model). Called where that test failed
-- (enqueue_run, create_schedule, fork_run), so the message is written once.
CREATE OR REPLACE FUNCTION runrow._require_model_trimmed(model text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $fn$
BEGIN
    IF NOT runrow._model_trimmed(model) THEN
        -- A line break, NEL or separator at either end is also a control character: named by
        -- its code point, since quoting it wrote a line of its own into the server's log.
        PERFORM runrow._require_printable(model, 'model');
        RAISE EXCEPTION 'model must not begin or end with white space, got "%"', left(model, 200)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

-- TRUE when doc nests 100 levels deep or more: past what every JSON client reads back (Python's
-- json module gives up near 1,000 levels, PostgreSQL's own recursive helpers, tool_call_key's
-- canonical form among them, near 500). The one place that depth is written. Inlined.
CREATE OR REPLACE FUNCTION runrow._json_too_deep(doc jsonb)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT jsonb_path_exists(doc, 'lax $.**{100}')
$fn$;

-- TRUE when every JSON client can read doc back: it is not _json_too_deep, and each number is
-- one an IEEE double can hold (jsonb keeps 1e5000 exactly and prints its 5,001 digits, which
-- Python refuses past 4,300). A claim hands metadata and tools to the worker: one such value at
-- the head of the queue made every claim of every worker fail (issue 11's SQL audit). Inlined.
CREATE OR REPLACE FUNCTION runrow._json_portable(doc jsonb)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT NOT runrow._json_too_deep(doc)
        AND NOT jsonb_path_exists(
            doc, 'lax $.** ? (@.type() == "number" && (@ > 1.7976931348623157e308 || @ < -1.7976931348623157e308))'
        )
$fn$;

-- Raises 22023 naming arg unless _json_portable(doc).
CREATE OR REPLACE FUNCTION runrow._require_portable_json(doc jsonb, arg text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $fn$
BEGIN
    IF runrow._json_too_deep(doc) THEN
        RAISE EXCEPTION '% nests 100 levels deep or more: JSON clients cannot read it back (at most 99)', arg
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT runrow._json_portable(doc) THEN
        RAISE EXCEPTION '% holds a number no double can hold (beyond ±1.7976931348623157e308): JSON clients '
            'cannot read it back', arg
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

-- TRUE when metadata is a run's metadata as enqueue_run takes it: a JSON object of at most 1 MiB
-- that JSON clients can read back, whose prompt_cache (if any) is "off", "5m" or "1h" (the
-- worker places prompt-cache breakpoints by it; a misspelt value would silently cache nothing,
-- or pay 1-hour writes nobody asked for) and whose traceparent (if any) is a W3C traceparent
-- (the caller's trace, which every attempt's spans continue: a value no tracer can parse would
-- silently start a new trace on every worker). CASE, so each test runs only when the ones
-- before it hold. Inlined; _require_metadata says what is wrong.
CREATE OR REPLACE FUNCTION runrow._metadata_ok(metadata jsonb)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT CASE
        WHEN jsonb_typeof(metadata) IS DISTINCT FROM 'object' THEN false
        WHEN octet_length(metadata::text) > 1048576 THEN false
        WHEN NOT runrow._json_portable(metadata) THEN false
        WHEN metadata ? 'prompt_cache' AND (metadata -> 'prompt_cache') NOT IN ('"off"', '"5m"', '"1h"') THEN false
        WHEN NOT metadata ? 'traceparent' THEN true
        ELSE coalesce(
            jsonb_typeof(metadata -> 'traceparent') = 'string'
            AND (metadata ->> 'traceparent') ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
            AND left(metadata ->> 'traceparent', 2) <> 'ff'
            AND substr(metadata ->> 'traceparent', 4, 32) <> repeat('0', 32)
            AND substr(metadata ->> 'traceparent', 37, 16) <> repeat('0', 16), false
        )
    END
$fn$;

-- TRUE when url is a webhook_url a request can be sent to: http:// or https://, at most 2048
-- characters, a host (a name, or an IPv6 address in brackets), and a port from 1 to 65535 if it
-- names one. A URL without them (http:///x, http://e.com:99999/, http://[::1/) failed every
-- delivery attempt the same way, long after the enqueue said yes. NULL for NULL. Written once for
-- enqueue_run's check and agent_run's own rule (_agent_run_settings). Inlined.
CREATE OR REPLACE FUNCTION runrow._webhook_url_ok(url text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT length(url) <= 2048 AND url ~ (
        '^https?://([^/?#@[:space:]]*@)?([^][/?#:@[:space:]]+|\[[0-9A-Fa-f:.]+\])'
        || '(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})?)?'
        || '([/?#][^[:space:]]*)?$'
    )
$fn$;

-- Raises 22004/22023 naming metadata (or the key) for the first rule of _metadata_ok it breaks.
-- Called where _metadata_ok said no, and by create_schedule.
CREATE OR REPLACE FUNCTION runrow._require_metadata(metadata jsonb)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $fn$
BEGIN
    IF metadata IS NULL THEN
        RAISE EXCEPTION 'metadata must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF jsonb_typeof(metadata) <> 'object' THEN
        RAISE EXCEPTION 'metadata must be a JSON object, got %', jsonb_typeof(metadata)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(metadata::text) > 1048576 THEN
        RAISE EXCEPTION 'metadata is too large: % bytes, the limit is 1 MiB', octet_length(metadata::text)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM runrow._require_portable_json(metadata, 'metadata');
    IF metadata ? 'prompt_cache' AND (metadata -> 'prompt_cache') NOT IN ('"off"', '"5m"', '"1h"') THEN
        RAISE EXCEPTION 'metadata.prompt_cache must be one of "off", "5m", "1h", got %', left((metadata -> 'prompt_cache')::text, 80)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT runrow._metadata_ok(metadata) THEN
        RAISE EXCEPTION 'metadata.traceparent must be a W3C traceparent (version-trace_id-parent_id-flags, '
            'lowercase hex, ids not all zero), got %', left((metadata -> 'traceparent')::text, 80)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

-- TRUE when the content blocks' cache_control markers are ones the API takes: each (if any, and
-- not null) {"type": "ephemeral"} with a ttl of "5m" or "1h" (if any), on at most 4 blocks (the
-- API's breakpoints per request). Not inlined (plpgsql), on purpose: it runs only for array
-- content, and an enqueue of a string pays nothing for its expression.
CREATE OR REPLACE FUNCTION runrow._cache_controls_ok(content jsonb)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
STRICT
AS $fn$
BEGIN
    RETURN NOT jsonb_path_exists(
        content,
        'strict $[*] ? (exists(@.keyvalue() ? (@.key == "cache_control" && @.value.type() != "null"'
        ' && (@.value.type() != "object" || !exists(@.value.keyvalue() ? (@.key == "type" && @.value == "ephemeral"))'
        ' || exists(@.value.keyvalue() ? (@.key == "ttl" && @.value != "5m" && @.value != "1h"))))))'
    ) AND jsonb_array_length(jsonb_path_query_array(
        content, 'strict $[*] ? (exists(@.keyvalue() ? (@.key == "cache_control" && @.value.type() != "null")))'
    )) <= 4;
END
$fn$;

-- TRUE when content is a user turn's content as the API takes it: a string with more than white
-- space, or a non-empty array of content blocks, each an object with a non-empty string "type"
-- that a user turn may hold (not one of the model's own: thinking, redacted_thinking, tool_use,
-- server_tool_use), a text block with non-empty text, an image or document with a source
-- object, a tool_result with a tool_use_id, a cache_control (if any, and not null) of type
-- ephemeral with a ttl of 5m or 1h (if any); at most 4 blocks with a cache_control (the API's
-- breakpoints per request). One SQL expression without a SET clause, so the
-- planner inlines it into the caller's IF (no call); _require_content says what is wrong.
-- Strict jsonpath (a nested array is not unwrapped into its elements), keys read through
-- keyvalue() (a missing key is no error there, where strict mode would make one of @.text).
CREATE OR REPLACE FUNCTION runrow._content_ok(content jsonb)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT CASE jsonb_typeof(content)
        WHEN 'string' THEN btrim(content #>> '{}', runrow._white_space()) <> ''
        WHEN 'array' THEN jsonb_array_length(content) > 0 AND runrow._json_portable(content) AND NOT jsonb_path_exists(
            content,
            'strict $[*] ? (@.type() != "object"'
            ' || !exists(@.keyvalue() ? (@.key == "type" && @.value.type() == "string" && @.value != ""))'
            ' || exists(@.keyvalue() ? (@.key == "type" && (@.value == "thinking" || @.value == "redacted_thinking"'
            ' || @.value == "tool_use" || @.value == "server_tool_use")))'
            ' || (exists(@.keyvalue() ? (@.key == "type" && @.value == "text"))'
            ' && !exists(@.keyvalue() ? (@.key == "text" && @.value.type() == "string" && @.value != "")))'
            ' || (exists(@.keyvalue() ? (@.key == "type" && (@.value == "image" || @.value == "document")))'
            ' && !exists(@.keyvalue() ? (@.key == "source" && @.value.type() == "object")))'
            ' || (exists(@.keyvalue() ? (@.key == "type" && @.value == "tool_result"))'
            ' && !exists(@.keyvalue() ? (@.key == "tool_use_id" && @.value.type() == "string" && @.value != ""))))'
        ) AND runrow._cache_controls_ok(content)
        ELSE false
    END
$fn$;

-- Raises 22004/22023 naming content (and content[i], 0-based, and the field) if content breaks
-- a rule of _content_ok; returns otherwise. Called where _content_ok said no, and by the
-- functions that store a turn's content for later (create_schedule).
CREATE OR REPLACE FUNCTION runrow._require_content(content jsonb)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $fn$
DECLARE
    block jsonb;
    i integer := -1;
    kind text;
    markers bigint;
BEGIN
    IF content IS NULL THEN
        RAISE EXCEPTION 'content must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT coalesce(
        (jsonb_typeof(content) = 'string' AND content #>> '{}' <> '')
        OR (jsonb_typeof(content) = 'array' AND jsonb_array_length(content) > 0),
        false
    ) THEN
        RAISE EXCEPTION 'content must be a non-empty string or a non-empty array of content blocks'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(content) = 'string' THEN
        IF btrim(content #>> '{}', runrow._white_space()) = '' THEN
            RAISE EXCEPTION 'content must hold more than white space (the API refuses a turn of white space only)'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        RETURN;
    END IF;
    FOR block IN SELECT b.el FROM jsonb_array_elements(content) AS b (el) LOOP
        i := i + 1;
        IF jsonb_typeof(block) <> 'object' THEN
            RAISE EXCEPTION 'content[%] must be a content block (a JSON object with a "type"), got %',
                i, jsonb_typeof(block)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF jsonb_typeof(block -> 'type') IS DISTINCT FROM 'string' OR block ->> 'type' = '' THEN
            RAISE EXCEPTION 'content[%].type must be a non-empty string such as "text" or "image", got %',
                i, coalesce((block -> 'type')::text, 'none')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        kind := block ->> 'type';
        IF kind IN ('thinking', 'redacted_thinking', 'tool_use', 'server_tool_use') THEN
            RAISE EXCEPTION 'content[%] is a "%" block, which only the model''s own turns hold, not a user''s',
                i, kind
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF kind = 'text' AND (jsonb_typeof(block -> 'text') IS DISTINCT FROM 'string' OR block ->> 'text' = '') THEN
            RAISE EXCEPTION 'content[%].text must be a non-empty string (the API refuses empty text blocks)', i
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF kind IN ('image', 'document') AND jsonb_typeof(block -> 'source') IS DISTINCT FROM 'object' THEN
            RAISE EXCEPTION 'content[%].source must be an object (the %''s data or URL)', i, kind
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF kind = 'tool_result'
           AND (jsonb_typeof(block -> 'tool_use_id') IS DISTINCT FROM 'string' OR block ->> 'tool_use_id' = '') THEN
            RAISE EXCEPTION 'content[%].tool_use_id must be a non-empty string (the tool_use this result answers)', i
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF jsonb_typeof(block -> 'cache_control') IS DISTINCT FROM 'null' AND block ? 'cache_control' AND (
            jsonb_typeof(block -> 'cache_control') <> 'object'
            OR block -> 'cache_control' -> 'type' IS DISTINCT FROM '"ephemeral"'
            OR coalesce(block -> 'cache_control' -> 'ttl' NOT IN ('"5m"', '"1h"'), false)
        ) THEN
            RAISE EXCEPTION 'content[%].cache_control must be {"type": "ephemeral"}, with a "ttl" of "5m" or "1h" '
                'if any, got %', i, left((block -> 'cache_control')::text, 80)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    markers := (SELECT count(*) FROM jsonb_array_elements(content) AS b (el)
        WHERE jsonb_typeof(b.el -> 'cache_control') IS DISTINCT FROM 'null' AND b.el ? 'cache_control');
    IF markers > 4 THEN
        RAISE EXCEPTION 'content has % blocks with a cache_control: a request holds at most 4 cache breakpoints',
            markers
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM runrow._require_portable_json(content, 'content');
END
$fn$;

-- Raises 22004/22023 naming tools (and tools[i], 0-based, and the field) unless tools is a JSON
-- array of tool definitions the API takes: each an object with a string "name"; a custom tool
-- (no "type", or "custom"; a server tool such as web search carries its own shape) with a name
-- of 1 to 128 letters, digits, "_" or "-" and an input_schema object of "type": "object"; no
-- name twice. Called when a prompt is first pinned (an enqueue that reuses a pinned prompt has
-- had its tools checked) and by create_schedule.
CREATE OR REPLACE FUNCTION runrow._require_tools(tools jsonb)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $fn$
DECLARE
    bad record;
BEGIN
    IF tools IS NULL THEN
        RAISE EXCEPTION 'tools must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF jsonb_typeof(tools) <> 'array' THEN
        RAISE EXCEPTION 'tools must be a JSON array of tool definitions, got %', jsonb_typeof(tools)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT t.i, t.def, t.custom, t.first INTO bad
    FROM (
        SELECT d.ord - 1 AS i, d.def,
               jsonb_typeof(d.def) = 'object' AND (d.def ->> 'type' IS NULL OR d.def ->> 'type' = 'custom') AS custom,
               min(d.ord - 1) OVER (PARTITION BY CASE WHEN jsonb_typeof(d.def) = 'object' THEN d.def -> 'name' END)
                   AS first
        FROM jsonb_array_elements(tools) WITH ORDINALITY AS d (def, ord)
    ) AS t
    WHERE jsonb_typeof(t.def) <> 'object'
       OR jsonb_typeof(t.def -> 'name') IS DISTINCT FROM 'string'
       OR (t.custom AND (
           t.def ->> 'name' !~ '^[a-zA-Z0-9_-]{1,128}$'
           OR jsonb_typeof(t.def -> 'input_schema') IS DISTINCT FROM 'object'
           OR (t.def -> 'input_schema' -> 'type') IS DISTINCT FROM '"object"'))
       OR t.first < t.i
    ORDER BY t.i
    LIMIT 1;
    IF NOT FOUND THEN
        PERFORM runrow._require_portable_json(tools, 'tools');
        RETURN;
    END IF;
    IF jsonb_typeof(bad.def) <> 'object' OR jsonb_typeof(bad.def -> 'name') IS DISTINCT FROM 'string' THEN
        RAISE EXCEPTION 'tools[%] must be an object with a string "name"', bad.i
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF bad.custom AND bad.def ->> 'name' !~ '^[a-zA-Z0-9_-]{1,128}$' THEN
        RAISE EXCEPTION 'tools[%].name must be 1 to 128 letters, digits, "_" or "-", got %', bad.i, bad.def -> 'name'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF bad.custom AND (
        jsonb_typeof(bad.def -> 'input_schema') IS DISTINCT FROM 'object'
        OR (bad.def -> 'input_schema' -> 'type') IS DISTINCT FROM '"object"'
    ) THEN
        RAISE EXCEPTION 'tools[%].input_schema must be a JSON schema object with "type": "object" '
            '(the shape of the tool''s input)', bad.i
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RAISE EXCEPTION 'tools[%].name % is already tools[%]: tool names must be unique', bad.i, bad.def -> 'name', bad.first
        USING ERRCODE = 'invalid_parameter_value';
END
$fn$;

COMMENT ON FUNCTION runrow._content_ok(jsonb) IS
'TRUE when content is a user turn''s content the Messages API takes: a non-empty string, or a '
'non-empty array of content blocks, each an object with a non-empty string type that is not one '
'of the model''s own (thinking, redacted_thinking, tool_use, server_tool_use), text blocks with '
'non-empty text, image and document blocks with a source object, tool_result blocks with a '
'tool_use_id; any other type passes. Inlined into its callers; _require_content names what is wrong.';

COMMENT ON FUNCTION runrow._require_content(jsonb) IS
'Raises 22004 for a NULL content, 22023 naming content, or content[i] (0-based) and its field, '
'for the first rule of _content_ok that content breaks; returns otherwise. Reads no table.';

COMMENT ON FUNCTION runrow._require_tools(jsonb) IS
'Raises 22004 for a NULL tools, 22023 naming tools or tools[i] (0-based) and its field unless '
'tools is a JSON array of tool definitions: objects with a string name; custom ones (no type, or '
'"custom") with a name of 1 to 128 of [a-zA-Z0-9_-] and an input_schema object of type object; '
'each name once. Returns otherwise. Reads no table.';

COMMENT ON FUNCTION runrow._cache_controls_ok(jsonb) IS
'TRUE when every content block''s cache_control (if any, and not null) is {"type": "ephemeral"} with a '
'ttl of "5m" or "1h" (if any), and at most 4 blocks carry one. Reads no table; _require_content names '
'the fault.';

COMMENT ON FUNCTION runrow._json_too_deep(jsonb) IS
'TRUE when doc nests 100 levels deep or more, past what JSON clients and '
'runrow''s own recursive helpers read back. Inlined into its callers.';

COMMENT ON FUNCTION runrow._json_portable(jsonb) IS
'TRUE when doc nests fewer than 100 levels and holds only numbers an IEEE double can hold, so that '
'every JSON client (Python''s json, JavaScript''s JSON.parse) reads it back. Inlined into its callers.';

COMMENT ON FUNCTION runrow._require_portable_json(jsonb, text) IS
'Raises 22023 naming arg when doc nests 100 levels or more, or holds a number beyond an IEEE '
'double''s range; returns otherwise. Reads no table.';

COMMENT ON FUNCTION runrow._metadata_ok(jsonb) IS
'TRUE when metadata is a JSON object of at most 1 MiB that _json_portable accepts, with a '
'prompt_cache (if any) of "off", "5m" or "1h" and a traceparent (if any) that is a W3C traceparent. '
'Inlined into its callers; _require_metadata names what is wrong.';

COMMENT ON FUNCTION runrow._require_metadata(jsonb) IS
'Raises 22004 for a NULL metadata, 22023 naming metadata or metadata.<key> for the first rule of '
'_metadata_ok it breaks; returns otherwise. Reads no table.';

COMMENT ON FUNCTION runrow._webhook_url_ok(text) IS
'TRUE when url is an http:// or https:// URL of at most 2048 characters with a host and, if it '
'names one, a port from 1 to 65535; NULL for NULL. enqueue_run''s check and agent_run''s rule '
'agent_run_webhook_url_http. Inlined.';

COMMENT ON FUNCTION runrow._white_space() IS
'White space, for every rule that speaks of it: Unicode''s White_Space (U+0009-U+000D, U+0020, '
'U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000), as one text '
'for btrim. Content of only these is refused; a model or schedule name may not begin or end with '
'one; decided_by and a defer reason may not be only these. Inlined and folded to a constant.';

COMMENT ON FUNCTION runrow._model_trimmed(text) IS
'TRUE when model neither begins nor ends with white space (_white_space); '
'NULL for NULL. Inlined into enqueue_run, create_schedule and fork_run.';

COMMENT ON FUNCTION runrow._require_model_trimmed(text) IS
'Raises 22023 unless _model_trimmed(model): _require_printable''s message when the white space '
'is a control character (a line break, NEL, U+2028/2029: named by code point, not quoted), else '
'"model must not begin or end with white space", quoting it.';

REVOKE ALL ON FUNCTION runrow._white_space() FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._model_trimmed(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._require_model_trimmed(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._webhook_url_ok(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._cache_controls_ok(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._json_too_deep(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._json_portable(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._require_portable_json(jsonb, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._metadata_ok(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._require_metadata(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._content_ok(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._require_content(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._require_tools(jsonb) FROM PUBLIC;
