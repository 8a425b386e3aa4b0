-- runrow.create_schedule: a schedule row with its first tick after now(), nothing enqueued;
-- bad input (a bad cron, a taken name, a bad template) raises naming the argument and
-- writes nothing.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(57);

CREATE FUNCTION pg_temp.schedules() RETURNS text LANGUAGE sql AS $$
    SELECT pg_temp.fingerprint() || ',' || (SELECT count(*) FROM runrow.schedule)::text || ','
        || md5(coalesce((SELECT string_agg(to_jsonb(s)::text, '' ORDER BY s.id) FROM runrow.schedule AS s), ''))
$$;

SELECT has_function('runrow', 'create_schedule',
    ARRAY['text', 'text', 'jsonb', 'text', 'uuid', 'text', 'text', 'jsonb', 'jsonb', 'integer', 'text', 'text', 'integer',
        'integer', 'text', 'text'],
    'create_schedule exists with the template arguments');
SELECT is_definer('runrow', 'create_schedule',
    ARRAY['text', 'text', 'jsonb', 'text', 'uuid', 'text', 'text', 'jsonb', 'jsonb', 'integer', 'text', 'text', 'integer',
        'integer', 'text', 'text'],
    'create_schedule is SECURITY DEFINER');
SELECT ok(length(obj_description('runrow.create_schedule(text, text, jsonb, text, uuid, text, text, jsonb, jsonb, '
    'integer, text, text, integer, integer, text, text)'::regprocedure, 'pg_proc')) > 200, 'create_schedule has a COMMENT stating its contract');

-- Happy path.
SELECT count(*) AS runs_before FROM runrow.agent_run \gset
SELECT runrow.create_schedule(name => 'nightly', cron => '0 3 * * *', content => '"summarize the day"',
    model => 'test-model', user_id => 'ops', system_prompt => 'be brief', tools => '[{"name": "t", "input_schema": {"type": "object"}}]',
    metadata => '{"k": 1}', max_attempts => 3) AS nightly \gset
SELECT is((SELECT (name, cron, conversation_id, content, model, user_id, system_prompt, tools, metadata,
        max_attempts, if_active, catch_up, max_catch_up)::text FROM runrow.schedule WHERE id = :'nightly'),
    ('nightly', '0 3 * * *', NULL::uuid, '"summarize the day"'::jsonb, 'test-model', 'ops', 'be brief',
     '[{"name": "t", "input_schema": {"type": "object"}}]'::jsonb, '{"k": 1}'::jsonb, 3, 'enqueue', 'latest', 1)::text,
    'the row holds the template; catch_up latest by default, which fires one tick');
SELECT is((SELECT next_fire_at FROM runrow.schedule WHERE id = :'nightly'),
    (date_trunc('day', now() AT TIME ZONE 'UTC') + CASE WHEN extract(HOUR FROM now() AT TIME ZONE 'UTC') >= 3
        THEN interval '1 day 3 hours' ELSE interval '3 hours' END) AT TIME ZONE 'UTC',
    'next_fire_at is the first 03:00 UTC after now()');
SELECT is((SELECT count(*) FROM runrow.agent_run), :'runs_before'::bigint, 'creating a schedule enqueues nothing');
SELECT is((SELECT (name, next_fire_at > now(), last_tick_at, last_run_id, last_run_status, last_error)::text
        FROM runrow.schedules WHERE id = :'nightly'),
    ('nightly', true, NULL::timestamptz, NULL::uuid, NULL::text, NULL::text)::text,
    'runrow.schedules shows it, not fired yet');

SELECT runrow.create_schedule('each', '*/5 * * * *', '"tick"', 'test-model', catch_up => 'each') AS each \gset
SELECT is((SELECT (catch_up, max_catch_up)::text FROM runrow.schedule WHERE id = :'each'), '(each,10)',
    'catch_up each catches up at most 10 ticks by default');
SELECT runrow.create_schedule('each-3', '@hourly', '"tick"', 'test-model', catch_up => 'each', max_catch_up => 3)
    AS each3 \gset
SELECT is((SELECT (cron, max_catch_up)::text FROM runrow.schedule WHERE id = :'each3'), '(@hourly,3)',
    'a macro is kept as written; max_catch_up as given');
SELECT runrow.create_schedule('fixed', '0 * * * *', '[{"type": "text", "text": "hi"}]', 'test-model',
    conversation_id => '00000000-0000-0000-0000-0000000000f1', if_active => 'reject') AS fixed \gset
SELECT is((SELECT (conversation_id, if_active)::text FROM runrow.schedule WHERE id = :'fixed'),
    '(00000000-0000-0000-0000-0000000000f1,reject)', 'a fixed conversation and if_active');

-- Bad input: each raises with a standard SQLSTATE naming the argument, and writes nothing.
SELECT pg_temp.schedules() AS before \gset
CREATE FUNCTION pg_temp.bad(args text) RETURNS text LANGUAGE sql AS $$
    SELECT format('SELECT runrow.create_schedule(%s)', args)
$$;
SELECT throws_ok(pg_temp.bad($$'nightly', '0 4 * * *', '"x"', 'm'$$), '23505',
    'name "nightly" is already taken by another schedule', 'a taken name: 23505');
SELECT throws_ok(pg_temp.bad($$'bad', '0 25 * * *', '"x"', 'm'$$), '22023',
    'cron "0 25 * * *": hour 25 is out of range 0-23', 'a cron out of range: 22023 naming cron');
SELECT throws_ok(pg_temp.bad($$'bad', 'every day', '"x"', 'm'$$), '22023',
    'cron "every day" must have five fields (minute hour day-of-month month day-of-week, UTC), got 2', 'not a cron');
SELECT throws_ok(pg_temp.bad($$'bad', '0 0 30 2 *', '"x"', 'm'$$), '22023',
    'cron "0 0 30 2 *" never fires (no matching minute in the next ten years)', 'a cron that never fires');
SELECT throws_ok(pg_temp.bad($$'bad', NULL, '"x"', 'm'$$), '22004', 'cron must not be NULL', 'NULL cron');
SELECT throws_ok(pg_temp.bad($$NULL, '* * * * *', '"x"', 'm'$$), '22004', 'name must not be NULL', 'NULL name');
SELECT throws_ok(pg_temp.bad($$'  ', '* * * * *', '"x"', 'm'$$), '22023', 'name must be 1 to 200 characters, not blank',
    'a blank name');
-- A name is typed back to drop the schedule: a line break broke `runrow schedules`' table, and
-- a space around it could not be named (issue 11's schedule audit).
SELECT throws_ok(pg_temp.bad(format('%L, ''* * * * *'', ''"x"'', ''m''', E'evil\nname')), '22023',
    'name must not hold control characters (C0, C1 or bidirectional formatting), got U+000A at character 5',
    'a name with a line break');
SELECT throws_ok(pg_temp.bad($$' padded', '* * * * *', '"x"', 'm'$$), '22023',
    'name must not begin or end with white space, got " padded"',
    'a name with a space before it');
SELECT throws_ok(pg_temp.bad($$'padded ', '* * * * *', '"x"', 'm'$$), '22023', NULL, 'or after it');
-- White space is Unicode's White_Space, wherever a rule speaks of it (the SQL audit: a name
-- beginning with a no-break space was taken; neither a regular expression's [[:space:]] nor
-- btrim's default knows it).
SELECT throws_ok(pg_temp.bad(format('%L, ''* * * * *'', ''"x"'', ''m''', E'\u00a0s1')), '22023',
    format('name must not begin or end with white space, got "%s"', E'\u00a0s1'),
    'a name with a no-break space before it');
SELECT throws_ok(pg_temp.bad(format('%L, ''* * * * *'', ''"x"'', ''m''', E's1\u3000')), '22023', NULL,
    'or an ideographic space after it');
SELECT throws_ok(pg_temp.bad(format('%L, ''* * * * *'', ''"x"'', ''m''', E'\u2003\u00a0')), '22023',
    'name must be 1 to 200 characters, not blank', 'a name of Unicode white space only is blank');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', NULL, 'm'$$), '22004', 'content must not be NULL', 'NULL content');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '""', 'm'$$), '22023',
    'content must be a non-empty string or a non-empty array of content blocks', 'empty content');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', ''$$), '22023',
    'model must be a non-empty model name of at most 200 characters', 'an empty model');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', 'm', user_id => ''$$), '22023',
    'user_id must be NULL or 1 to 200 characters', 'an empty user_id');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', 'm', tools => '{}'$$), '22023',
    'tools must be a JSON array of tool definitions, got object', 'tools not an array');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', 'm', metadata => '[]'$$), '22023',
    'metadata must be a JSON object, got array', 'metadata not an object');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', 'm', max_attempts => 0$$), '22023',
    'max_attempts must be between 1 and 100, got 0', 'max_attempts out of range');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', 'm', priority => 1001$$), '22023',
    'priority must be between -1000 and 1000, got 1001', 'priority out of range');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', 'm', fairness_key => ''$$), '22023',
    'fairness_key must be NULL or 1 to 200 characters', 'an empty fairness_key');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', 'm', concurrency_key => repeat('k', 201)$$), '22023',
    'concurrency_key must be NULL or 1 to 200 characters', 'a concurrency_key too long');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', 'm', if_active => 'queue'$$), '22023',
    'if_active must be one of enqueue, reject, interrupt, got "queue"', 'an unknown if_active');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', 'm', if_active => 'reject'$$), '22023',
    'if_active reject needs a conversation_id: without one every tick opens a new conversation, which has no '
    'active run to reject', 'reject without a conversation: it would never act');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', 'm', catch_up => 'all'$$), '22023', NULL,
    'an unknown catch_up');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', 'm', catch_up => NULL$$), '22004',
    'catch_up must not be NULL', 'NULL catch_up');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', 'm', catch_up => 'each', max_catch_up => 0$$), '22023',
    'max_catch_up must be between 1 and 1000, got 0', 'max_catch_up out of range');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', 'm', catch_up => 'each', max_catch_up => 1001$$), '22023',
    'max_catch_up must be between 1 and 1000, got 1001', 'max_catch_up above 1000');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', 'm', conversation_id => gen_random_uuid(),
        if_active => 'interrupt', catch_up => 'each'$$), '22023',
    'catch_up each cannot go with if_active interrupt: after an outage every missed tick would be enqueued and '
    'stop the one before it, so all but the last would be cancelled; use catch_up latest (only the most recent '
    'missed tick)', 'catch_up each with if_active interrupt: all but the last tick would be cancelled');
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', 'm', max_catch_up => 5$$), '22023',
    'max_catch_up must be NULL or 1 with catch_up latest, got 5', 'max_catch_up with latest');
SELECT runrow.enqueue_run('00000000-0000-0000-0000-0000000000a1', '"mine"', 'm', user_id => 'alice');
SELECT pg_temp.schedules() AS before \gset
SELECT throws_ok(pg_temp.bad($$'bad', '* * * * *', '"x"', 'm', user_id => 'bob',
        conversation_id => '00000000-0000-0000-0000-0000000000a1'$$), '42501',
    'conversation_id 00000000-0000-0000-0000-0000000000a1 belongs to another user',
    'a fixed conversation of another user: 42501');
SELECT is(pg_temp.schedules(), :'before', 'no bad call wrote anything');
SELECT lives_ok(pg_temp.bad($$'alice''s', '* * * * *', '"x"', 'm', user_id => 'alice',
        conversation_id => '00000000-0000-0000-0000-0000000000a1'$$), 'the owner may schedule into it');

-- The table's own rules, for a write that bypasses create_schedule.
SELECT throws_ok($$UPDATE runrow.schedule SET name = E'a\tb' WHERE name = 'nightly'$$, '23514', NULL,
    'schedule_name_printable holds for a direct update');
SELECT throws_ok($$UPDATE runrow.schedule SET name = E'nightly\u00a0' WHERE name = 'nightly'$$, '23514', NULL,
    'schedule_name_printable knows Unicode white space too');
-- A name written before that rule (as migration 0067 found older names) stays, and is checked
-- again only when the name changes: a CHECK would refuse the firing pass's update of the row,
-- and with it the pass, every pass, at the oldest due schedule.
SELECT runrow.create_schedule('older', '* * * * *', '"x"', 'm') AS older \gset
ALTER TABLE runrow.schedule DISABLE TRIGGER schedule_name_printable;
UPDATE runrow.schedule SET name = E'\u00a0older' WHERE id = :'older';
ALTER TABLE runrow.schedule ENABLE TRIGGER schedule_name_printable;
UPDATE runrow.schedule SET next_fire_at = now() - interval '1 minute' WHERE id = :'older';
SELECT lives_ok('SELECT runrow.fire_schedules()', 'a firing pass takes a schedule of an older name');
SELECT ok((SELECT next_fire_at > now() AND last_error IS NULL FROM runrow.schedule WHERE id = :'older'),
    'and moves it on');
SELECT lives_ok(format('SELECT runrow.drop_schedule(%L)', E'\u00a0older'), 'it is still dropped by its name');
SELECT throws_ok($$UPDATE runrow.schedule SET cron = '0 9 * * mon-fry' WHERE name = 'nightly'$$, '22023',
    'cron "0 9 * * mon-fry": the day-of-week field has "fry" where a number or a name is expected',
    'a cron that does not parse is refused whoever writes it (trigger schedule_cron_parses)');
SELECT is_empty($$SELECT * FROM runrow.audit() WHERE invariant = 'schema_guard_missing'$$,
    'audit: the schedule guard is in place');
ALTER TABLE runrow.schedule DISABLE TRIGGER schedule_cron_parses;
SELECT is((SELECT detail FROM runrow.audit() WHERE invariant = 'schema_guard_missing'),
    'trigger schedule_cron_parses on runrow.schedule is missing, invalid or disabled', 'audit reports it disabled');
ALTER TABLE runrow.schedule ENABLE TRIGGER schedule_cron_parses;
-- A new schedule's prompt is pinned at once, so a firing pass only reads it.
SELECT runrow.create_schedule('pinned', '@daily', '"x"', 'm', system_prompt => 'a prompt nothing pinned before');
SELECT is((SELECT count(*)::int FROM runrow.prompt WHERE system_prompt = 'a prompt nothing pinned before'), 1,
    'create_schedule pins the schedule''s prompt');

-- Roles: the client creates schedules; the worker and the auditor cannot.
SELECT lives_ok($$SELECT pg_temp.as_role('runrow_client',
    'SELECT runrow.create_schedule(''by-client'', ''* * * * *'', ''"x"'', ''m'')')$$, 'runrow_client may create');
SELECT throws_ok($$SELECT pg_temp.as_role('runrow_worker',
    'SELECT runrow.create_schedule(''by-worker'', ''* * * * *'', ''"x"'', ''m'')')$$, '42501', NULL,
    'runrow_worker may not');
SELECT throws_ok($$SELECT pg_temp.as_role('runrow_auditor',
    'SELECT runrow.create_schedule(''by-auditor'', ''* * * * *'', ''"x"'', ''m'')')$$, '42501', NULL,
    'runrow_auditor may not');
SELECT lives_ok($$SELECT pg_temp.as_role('runrow_client', 'SELECT count(*) FROM runrow.schedules')$$,
    'runrow_client reads runrow.schedules');

SELECT * FROM finish();
ROLLBACK;
