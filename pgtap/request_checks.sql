-- functions/_request_checks.sql: a turn's content blocks and a run's tool definitions that the
-- Messages API would refuse on every attempt are refused at enqueue_run and create_schedule
-- (22023 naming the argument, the element and the field), and change nothing; what the API
-- takes, and block types runrow does not know, pass. _content_ok (the enqueue's inlined test)
-- and _require_content (its message) agree on every case.
BEGIN;
\ir helpers/setup.psql
SELECT plan(78);
SELECT pg_temp.drain_queue();

CREATE TEMP TABLE content_case (content jsonb, message text, label text);
INSERT INTO content_case VALUES
    ('"hello"', NULL, 'a string'),
    ('[{"type": "text", "text": "look"}]', NULL, 'a text block'),
    ('[{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}, '
     '{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}, '
     '{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}}]',
     NULL, 'text, image and document blocks'),
    ('[{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}]', NULL, 'a tool_result block'),
    ('[{"type": "search_result_2031", "anything": [1, 2]}]', NULL, 'a block type runrow does not know'),
    ('[1]', 'content[0] must be a content block (a JSON object with a "type"), got number', 'a number'),
    ('[{"type": "text", "text": "a"}, "b"]',
     'content[1] must be a content block (a JSON object with a "type"), got string', 'a bare string'),
    ('[[{"type": "text", "text": "a"}]]',
     'content[0] must be a content block (a JSON object with a "type"), got array', 'a nested array'),
    ('[{"text": "a"}]', 'content[0].type must be a non-empty string such as "text" or "image", got none',
     'a block without a type'),
    ('[{"type": 7, "text": "a"}]', 'content[0].type must be a non-empty string such as "text" or "image", got 7',
     'a numeric type'),
    ('[{"type": ""}]', 'content[0].type must be a non-empty string such as "text" or "image", got ""',
     'an empty type'),
    ('[{"type": "tool_use", "id": "t", "name": "n", "input": {}}]',
     'content[0] is a "tool_use" block, which only the model''s own turns hold, not a user''s', 'a tool_use'),
    ('[{"type": "text", "text": "a"}, {"type": "thinking", "thinking": "t", "signature": "s"}]',
     'content[1] is a "thinking" block, which only the model''s own turns hold, not a user''s', 'a thinking block'),
    ('[{"type": "redacted_thinking", "data": "x"}]',
     'content[0] is a "redacted_thinking" block, which only the model''s own turns hold, not a user''s',
     'a redacted_thinking block'),
    ('[{"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}]',
     'content[0] is a "server_tool_use" block, which only the model''s own turns hold, not a user''s',
     'a server_tool_use block'),
    ('[{"type": "text", "text": ""}]',
     'content[0].text must be a non-empty string (the API refuses empty text blocks)', 'an empty text'),
    ('[{"type": "text"}]', 'content[0].text must be a non-empty string (the API refuses empty text blocks)',
     'a text block without text'),
    ('[{"type": "text", "text": ["a"]}]',
     'content[0].text must be a non-empty string (the API refuses empty text blocks)', 'text in an array'),
    ('[{"type": "image", "url": "https://x/y.png"}]',
     'content[0].source must be an object (the image''s data or URL)', 'an image without a source'),
    ('[{"type": "document", "source": "https://x/y.pdf"}]',
     'content[0].source must be an object (the document''s data or URL)', 'a document whose source is a string'),
    ('[{"type": "tool_result", "content": "42"}]',
     'content[0].tool_use_id must be a non-empty string (the tool_use this result answers)',
     'a tool_result without tool_use_id'),
    ('[]', 'content must be a non-empty string or a non-empty array of content blocks', 'an empty array'),
    ('{"type": "text", "text": "a"}', 'content must be a non-empty string or a non-empty array of content blocks',
     'one block, not in an array'),
    (to_jsonb(E' \t\n\r\x0b\f '::text), 'content must hold more than white space (the API refuses a turn of white '
     'space only)', 'a string of white space'),
    ('"  hi \n"', NULL, 'a string with white space around it'),
    (to_jsonb(E'\u00a0\u2003\u3000\u0085'::text), 'content must hold more than white space (the API refuses a turn '
     'of white space only)', 'a string of Unicode white space'),
    ('[{"type": "text", "text": "a", "cache_control": {"type": "forever"}}]',
     'content[0].cache_control must be {"type": "ephemeral"}, with a "ttl" of "5m" or "1h" if any, got {"type": "forever"}',
     'a cache_control of another type'),
    ('[{"type": "text", "text": "a"}, {"type": "text", "text": "b", "cache_control": {"type": "ephemeral", "ttl": "2h"}}]',
     'content[1].cache_control must be {"type": "ephemeral"}, with a "ttl" of "5m" or "1h" if any, got '
     '{"ttl": "2h", "type": "ephemeral"}', 'a cache_control ttl of 2h'),
    ('[{"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": null}}]',
     'content[0].cache_control must be {"type": "ephemeral"}, with a "ttl" of "5m" or "1h" if any, got '
     '{"ttl": null, "type": "ephemeral"}', 'a cache_control ttl of null'),
    ('[{"type": "text", "text": "a", "cache_control": "ephemeral"}]',
     'content[0].cache_control must be {"type": "ephemeral"}, with a "ttl" of "5m" or "1h" if any, got "ephemeral"',
     'a cache_control that is a string'),
    ('[{"type": "text", "text": "a", "cache_control": null}, {"type": "text", "text": "b", "cache_control": '
     '{"type": "ephemeral", "ttl": "1h"}}]', NULL, 'a null cache_control and a 1h one'),
    (jsonb_build_array(jsonb_build_object('type', 'text', 'text', 'a', 'cache_control', '{"type": "ephemeral"}'::jsonb),
        jsonb_build_object('type', 'text', 'text', 'b', 'cache_control', '{"type": "ephemeral"}'::jsonb),
        jsonb_build_object('type', 'text', 'text', 'c', 'cache_control', '{"type": "ephemeral"}'::jsonb),
        jsonb_build_object('type', 'text', 'text', 'd', 'cache_control', '{"type": "ephemeral"}'::jsonb),
        jsonb_build_object('type', 'text', 'text', 'e', 'cache_control', 'null'::jsonb)),
     NULL, 'four blocks with a cache_control'),
    (jsonb_build_array(jsonb_build_object('type', 'text', 'text', 'a', 'cache_control', '{"type": "ephemeral"}'::jsonb),
        jsonb_build_object('type', 'text', 'text', 'b', 'cache_control', '{"type": "ephemeral"}'::jsonb),
        jsonb_build_object('type', 'text', 'text', 'c', 'cache_control', '{"type": "ephemeral"}'::jsonb),
        jsonb_build_object('type', 'text', 'text', 'd', 'cache_control', '{"type": "ephemeral"}'::jsonb),
        jsonb_build_object('type', 'text', 'text', 'e', 'cache_control', '{"type": "ephemeral"}'::jsonb)),
     'content has 5 blocks with a cache_control: a request holds at most 4 cache breakpoints',
     'five blocks with a cache_control');

-- The inlined test and the helper that names the fault read every case alike.
CREATE FUNCTION pg_temp.require_says(c jsonb) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM runrow._require_content(c);
    RETURN NULL;
EXCEPTION WHEN invalid_parameter_value THEN
    RETURN SQLERRM;
END
$$;
SELECT is(
    (SELECT string_agg(c.label, '; ') FROM content_case AS c
     WHERE runrow._content_ok(c.content) IS DISTINCT FROM (c.message IS NULL)
        OR pg_temp.require_says(c.content) IS DISTINCT FROM c.message),
    NULL,
    '_content_ok and _require_content agree with every case');

SELECT pg_temp.fingerprint() AS before \gset

-- Through enqueue_run: each bad case is a 22023 with its message, each good one is enqueued.
SELECT throws_ok(
    format('SELECT * FROM runrow.enqueue_run(gen_random_uuid(), %L, ''m'')', c.content),
    '22023', c.message, 'enqueue_run refuses ' || c.label)
FROM content_case AS c WHERE c.message IS NOT NULL;
SELECT is(pg_temp.fingerprint(), :'before', 'refused content writes nothing');
SELECT lives_ok(
    format('SELECT * FROM runrow.enqueue_run(gen_random_uuid(), %L, ''m'')', c.content),
    'enqueue_run takes ' || c.label)
FROM content_case AS c WHERE c.message IS NULL;

-- Through create_schedule: the template is checked now, not at every tick.
SELECT throws_ok(
    $$SELECT runrow.create_schedule('bad blocks', '* * * * *', '[{"type": "tool_use", "id": "t", "name": "n", "input": {}}]', 'm')$$,
    '22023', 'content[0] is a "tool_use" block, which only the model''s own turns hold, not a user''s',
    'create_schedule refuses a block enqueue_run refuses');

-- Tools: checked in full when their prompt is first pinned, and by create_schedule.
CREATE FUNCTION pg_temp.enqueue_tools(t jsonb) RETURNS uuid LANGUAGE sql AS $$
    SELECT run_id FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', tools => t)
$$;
SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok($$SELECT pg_temp.enqueue_tools('[{"name": "get weather", "input_schema": {"type": "object"}}]')$$,
    '22023', 'tools[0].name must be 1 to 128 letters, digits, "_" or "-", got "get weather"', 'a name with a space');
SELECT throws_ok(format('SELECT pg_temp.enqueue_tools(%L)',
        jsonb_build_array(jsonb_build_object('name', repeat('n', 129), 'input_schema', '{"type": "object"}'::jsonb))),
    '22023', format('tools[0].name must be 1 to 128 letters, digits, "_" or "-", got "%s"', repeat('n', 129)),
    'a name of 129 characters');
SELECT throws_ok($$SELECT pg_temp.enqueue_tools('[{"name": "", "input_schema": {"type": "object"}}]')$$,
    '22023', 'tools[0].name must be 1 to 128 letters, digits, "_" or "-", got ""', 'an empty name');
SELECT throws_ok($$SELECT pg_temp.enqueue_tools('[{"name": "a", "input_schema": {"type": "object"}}, {"name": "b"}]')$$,
    '22023', 'tools[1].input_schema must be a JSON schema object with "type": "object" (the shape of the tool''s input)',
    'a custom tool without input_schema');
SELECT throws_ok($$SELECT pg_temp.enqueue_tools('[{"name": "a", "type": "custom", "input_schema": {"type": "string"}}]')$$,
    '22023', 'tools[0].input_schema must be a JSON schema object with "type": "object" (the shape of the tool''s input)',
    'an input_schema of another type');
SELECT throws_ok($$SELECT pg_temp.enqueue_tools('[{"name": "a", "input_schema": "{}"}]')$$,
    '22023', 'tools[0].input_schema must be a JSON schema object with "type": "object" (the shape of the tool''s input)',
    'an input_schema that is a string');
SELECT throws_ok(
    $$SELECT pg_temp.enqueue_tools('[{"name": "a", "input_schema": {"type": "object"}}, '
        '{"type": "web_search_20250305", "name": "web_search"}, {"name": "a", "input_schema": {"type": "object"}}]')$$,
    '22023', 'tools[2].name "a" is already tools[0]: tool names must be unique', 'a name twice');
SELECT throws_ok(
    $$SELECT pg_temp.enqueue_tools('[{"type": "web_search_20250305", "name": "web_search"}, '
        '{"name": "web_search", "input_schema": {"type": "object"}}]')$$,
    '22023', 'tools[1].name "web_search" is already tools[0]: tool names must be unique',
    'a custom tool named as a server tool');
SELECT is(pg_temp.fingerprint(), :'before', 'refused tools write nothing');
-- A new prompt's tools are checked before the conversation is looked at: a bad definition sent
-- to a busy conversation with if_active reject is a 22023, not a 55000 (a 409 a client retries).
SELECT run_id AS busy FROM runrow.enqueue_run(gen_random_uuid(), '"first"', 'm') \gset
SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok(format($$SELECT * FROM runrow.enqueue_run(%L, '"second"', 'm', if_active => 'reject',
        tools => '[{"name": "t"}]')$$, (SELECT conversation_id FROM runrow.agent_run WHERE id = :'busy')),
    '22023', 'tools[0].input_schema must be a JSON schema object with "type": "object" (the shape of the tool''s input)',
    'bad tools to a busy conversation: the tools are named, not the busy conversation');
SELECT is(pg_temp.fingerprint(), :'before', 'and writes nothing');
SELECT lives_ok(
    $$SELECT pg_temp.enqueue_tools('[{"name": "get_weather-2", "description": "d", "input_schema": '
        '{"type": "object", "properties": {"city": {"type": "string"}}}}, '
        '{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]')$$,
    'a custom tool and a server tool (which carries no input_schema) are taken');
SELECT throws_ok(
    $$SELECT runrow.create_schedule('bad tools', '* * * * *', '"x"', 'm', tools => '[{"name": "t"}]')$$,
    '22023', 'tools[0].input_schema must be a JSON schema object with "type": "object" (the shape of the tool''s input)',
    'create_schedule refuses a tool enqueue_run refuses');
SELECT throws_ok(
    $$SELECT runrow.create_schedule('bad tools', '* * * * *', '"x"', 'm', tools => '[1]')$$,
    '22023', 'tools[0] must be an object with a string "name"', 'create_schedule names the element');

-- A prompt pinned before these checks existed is not checked again (its tools are settled):
-- the check runs when a prompt is first pinned, so reusing one costs an enqueue nothing.
INSERT INTO runrow.prompt (id, system_prompt, tools)
SELECT encode(sha256(convert_to(jsonb_build_object('system', NULL::text, 'tools', '[{"name": "old"}]'::jsonb)::text,
    'UTF8')), 'hex'), NULL, '[{"name": "old"}]';
SELECT lives_ok($$SELECT pg_temp.enqueue_tools('[{"name": "old"}]')$$,
    'an enqueue that reuses a pinned prompt does not check its tools again');

-- JSON every client can read back: a claim hands metadata and tools to the worker, and one
-- value Python's json cannot read (a 5,001-digit number, 1,000 levels of nesting) at the head of
-- the queue made every claim of every worker fail. Refused at enqueue and at create_schedule.
CREATE FUNCTION pg_temp.nested(levels int) RETURNS jsonb LANGUAGE sql AS $$
    SELECT (repeat('{"a":', levels - 1) || '1' || repeat('}', levels - 1))::jsonb
$$;
SELECT is(jsonb_path_exists(pg_temp.nested(100), 'lax $.**{99}') AND NOT jsonb_path_exists(pg_temp.nested(100), 'lax $.**{100}'),
    true, 'pg_temp.nested(100) nests 99 objects (the last level holds the number)');
SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', metadata => '{"n": 1e5000}')$$,
    '22023', 'metadata holds a number no double can hold (beyond ±1.7976931348623157e308): JSON clients cannot read it back',
    'metadata with a number beyond a double');
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', metadata => '{"n": [-2e308]}')$$,
    '22023', 'metadata holds a number no double can hold (beyond ±1.7976931348623157e308): JSON clients cannot read it back',
    'metadata with a negative one, in an array');
SELECT throws_ok(format('SELECT * FROM runrow.enqueue_run(gen_random_uuid(), ''"q"'', ''m'', metadata => %L)',
        pg_temp.nested(101)),
    '22023', 'metadata nests 100 levels deep or more: JSON clients cannot read it back (at most 99)',
    'metadata nested 100 levels');
SELECT throws_ok(format('SELECT * FROM runrow.enqueue_run(gen_random_uuid(), ''"q"'', ''m'', metadata => %L)',
        jsonb_build_object('pad', repeat('x', 1048576))),
    '22023', 'metadata is too large: 1048587 bytes, the limit is 1 MiB', 'metadata over 1 MiB');
SELECT throws_ok(
    $$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '[{"type": "text", "text": "a", "n": 1e400}]', 'm')$$,
    '22023', 'content holds a number no double can hold (beyond ±1.7976931348623157e308): JSON clients cannot read it back',
    'content with a number beyond a double');
SELECT throws_ok(
    $$SELECT pg_temp.enqueue_tools('[{"name": "t", "input_schema": {"type": "object", "maximum": 1e5000}}]')$$,
    '22023', 'tools holds a number no double can hold (beyond ±1.7976931348623157e308): JSON clients cannot read it back',
    'tools with a number beyond a double');
SELECT throws_ok(
    format('SELECT pg_temp.enqueue_tools(%L)', jsonb_build_array(jsonb_build_object(
        'name', 't', 'input_schema', jsonb_build_object('type', 'object', 'deep', pg_temp.nested(99))))),
    '22023', 'tools nests 100 levels deep or more: JSON clients cannot read it back (at most 99)', 'tools nested 100 levels');
SELECT throws_ok(
    $$SELECT runrow.create_schedule('bad metadata', '* * * * *', '"x"', 'm', metadata => '{"n": 1e5000}')$$,
    '22023', 'metadata holds a number no double can hold (beyond ±1.7976931348623157e308): JSON clients cannot read it back',
    'create_schedule refuses such metadata');
-- create_schedule checks the template's metadata as enqueue_run does (it used to skip these,
-- and every tick then failed).
SELECT throws_ok(
    $$SELECT runrow.create_schedule('bad cache', '* * * * *', '"x"', 'm', metadata => '{"prompt_cache": "forever"}')$$,
    '22023', 'metadata.prompt_cache must be one of "off", "5m", "1h", got "forever"', 'create_schedule: prompt_cache');
SELECT throws_ok(
    $$SELECT runrow.create_schedule('bad trace', '* * * * *', '"x"', 'm', metadata => '{"traceparent": "nope"}')$$,
    '22023', 'metadata.traceparent must be a W3C traceparent (version-trace_id-parent_id-flags, lowercase hex, '
        'ids not all zero), got "nope"', 'create_schedule: traceparent');
SELECT is(pg_temp.fingerprint(), :'before', 'refused metadata writes nothing');
SELECT lives_ok(
    format('SELECT * FROM runrow.enqueue_run(gen_random_uuid(), ''"q"'', ''m'', metadata => %L)',
        jsonb_build_object('deep', pg_temp.nested(98), 'max', 1.7976931348623157e308, 'tiny', 1e-400)),
    'metadata nested 99 levels, with a double''s largest number and a tiny one, is taken');

-- The depth is written once, in _json_too_deep, and inlined with _json_portable into the
-- statements that test it (no function call per enqueue).
SELECT is(ARRAY[runrow._json_too_deep(pg_temp.nested(100)), runrow._json_too_deep(pg_temp.nested(101)),
        runrow._json_too_deep('[[[]]]'), runrow._json_too_deep('1')],
    ARRAY[false, true, false, false], '_json_too_deep: 99 levels pass, 100 do not');
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
CREATE TEMP TABLE doc (d jsonb);
SELECT unalike(pg_temp.plan_text($$SELECT runrow._json_portable(d) FROM doc$$),
    '%\_json\_%', '_json_portable and _json_too_deep are inlined (no call per document)');
CREATE TEMP TABLE hook (u text);
SELECT unalike(pg_temp.plan_text($$SELECT runrow._webhook_url_ok(u) FROM hook$$),
    '%\_webhook\_url\_ok%', '_webhook_url_ok is inlined (enqueue_run and agent_run''s rule pay no call for it)');
CREATE TEMP TABLE named (m text, c jsonb);
SELECT unalike(pg_temp.plan_text($$SELECT runrow._model_trimmed(m), runrow._content_ok(c) FROM named$$),
    '%\_white\_space%', '_white_space is folded into _model_trimmed and _content_ok (a constant, no call)');
SELECT unalike(pg_temp.plan_text($$SELECT runrow._model_trimmed(m) FROM named$$),
    '%\_model\_trimmed%', '_model_trimmed is inlined (enqueue_run pays no call for it)');
SELECT is(ARRAY[runrow._webhook_url_ok('https://h.test:443/x'), runrow._webhook_url_ok('http://h.test:65536/'),
        runrow._webhook_url_ok(NULL)],
    ARRAY[true, false, NULL], '_webhook_url_ok: a host and a port up to 65535; NULL for NULL, as a CHECK reads it');

-- One notion of white space, Unicode's White_Space, for every rule that speaks of it: exactly
-- these code points of the Basic Multilingual Plane are trimmed (U+200B, a zero-width space, and
-- U+FEFF, a byte order mark, are not white space to Unicode either).
SELECT is((SELECT string_agg(to_hex(c.cp), ',' ORDER BY c.cp)
           FROM generate_series(1, 65533) AS c (cp)
           WHERE c.cp NOT BETWEEN 55296 AND 57343 AND btrim(chr(c.cp), runrow._white_space()) = ''),
    '9,a,b,c,d,20,85,a0,1680,2000,2001,2002,2003,2004,2005,2006,2007,2008,2009,200a,2028,2029,202f,205f,3000',
    '_white_space is Unicode''s White_Space: every code point of it, no other');

-- A model id with white space around it (a paste) failed at the API once claimed.
SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'claude-x ')$$, '22023',
    'model must not begin or end with white space, got "claude-x "', 'enqueue_run: a model with a trailing space');
SELECT throws_ok($$SELECT runrow.create_schedule('ws', '* * * * *', '"x"', E'\tclaude-x')$$, '22023',
    'model must not hold control characters (C0, C1 or bidirectional formatting), got U+0009 at character 1',
    'create_schedule: a model with a leading tab, named by code point');
SELECT throws_ok($$SELECT * FROM runrow.fork_run(gen_random_uuid(), 0, E'claude-x\n')$$, '22023',
    'model must not hold control characters (C0, C1 or bidirectional formatting), got U+000A at character 9',
    'fork_run: a model with a trailing newline, named by code point');
SELECT throws_ok(format('SELECT * FROM runrow.enqueue_run(gen_random_uuid(), ''"q"'', %L)', 'claude-x' || chr(160)),
    '22023', format('model must not begin or end with white space, got "%s"', 'claude-x' || chr(160)),
    'enqueue_run: a model with a trailing no-break space');
SELECT throws_ok(format('SELECT * FROM runrow.enqueue_run(gen_random_uuid(), ''"q"'', %L)', E'\u2003claude-x'),
    '22023', format('model must not begin or end with white space, got "%s"', E'\u2003claude-x'),
    'enqueue_run: a model with a leading em space');
SELECT is(pg_temp.fingerprint(), :'before', 'and nothing is written');
SELECT lives_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'claude x')$$,
    'white space inside a model name is the API''s to judge');

SELECT * FROM finish();
ROLLBACK;
