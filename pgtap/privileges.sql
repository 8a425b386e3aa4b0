-- Who may do what (SPEC.md "Roles", invariant 6): each runrow role calls exactly its
-- functions and nothing else, writes no table directly, PUBLIC executes nothing, every
-- SECURITY DEFINER function pins its search_path, and the private helpers (files _claim,
-- _end_claim, _helpers, _stop_run, ...) are executable by no runrow role. Calls really
-- run under SET ROLE (pg_temp.as_role), so a grant that is missing or too wide fails here.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT pg_temp.drain_queue();

-- Fixtures the allowed calls need: an ended run to read and cancel, a failed one to retry.
SELECT pg_temp.finished('completed') AS done \gset
SELECT pg_temp.finished('failed') AS failed \gset
SELECT runrow.create_schedule('privileges-drop', '@daily', '"x"', 'm');

-- The grant matrix of SPEC.md for the lifecycle API: function, roles allowed, and a call
-- that succeeds for an allowed role (so lives_ok proves the grant, not just the absence
-- of an error message).
CREATE TEMP TABLE api (fn name PRIMARY KEY, roles name[] NOT NULL, call text NOT NULL);
INSERT INTO api VALUES
    ('claim_run', '{runrow_worker}', $$SELECT * FROM runrow.claim_run('w', 30)$$),
    ('claim_runs', '{runrow_worker}', $$SELECT * FROM runrow.claim_runs('w', 2, 30)$$),
    ('heartbeat', '{runrow_worker}', $$SELECT * FROM runrow.heartbeat(gen_random_uuid(), gen_random_uuid(), 30)$$),
    ('append_events', '{runrow_worker}',
        $$SELECT runrow.append_events(gen_random_uuid(), gen_random_uuid(), '[{"type": "x"}]')$$),
    ('append_runs_events', '{runrow_worker}', $$SELECT * FROM runrow.append_runs_events('[]')$$),
    ('finish_run', '{runrow_worker}', $$SELECT runrow.finish_run(gen_random_uuid(), gen_random_uuid(), 'completed')$$),
    ('finish_runs', '{runrow_worker}', $$SELECT * FROM runrow.finish_runs('[]')$$),
    ('finish_and_claim_runs', '{runrow_worker}', $$SELECT * FROM runrow.finish_and_claim_runs('[]', 'w', 1, 30)$$),
    ('reap_expired_runs', '{runrow_worker}', $$SELECT * FROM runrow.reap_expired_runs(30, 10)$$),
    ('release_run', '{runrow_worker}', $$SELECT runrow.release_run(gen_random_uuid(), gen_random_uuid())$$),
    ('trim_journal', '{runrow_worker}', $$SELECT runrow.trim_journal('100 years')$$),
    ('read_events', '{runrow_worker,runrow_client}', format($$SELECT * FROM runrow.read_events(%L)$$, :'done')),
    ('enqueue_run', '{runrow_client}', $$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"hi"', 'm')$$),
    ('stop_conversation', '{runrow_client}', format($$SELECT * FROM runrow.stop_conversation(%L)$$,
        (SELECT conversation_id FROM runrow.agent_run WHERE id = :'done'))),
    ('cancel_run', '{runrow_client}', format($$SELECT runrow.cancel_run(%L)$$, :'done')),
    ('retry_run', '{runrow_client}', format($$SELECT runrow.retry_run(%L)$$, :'failed')),
    ('create_schedule', '{runrow_client}', $$SELECT runrow.create_schedule('privileges', '@daily', '"x"', 'm')$$),
    ('drop_schedule', '{runrow_client}', $$SELECT runrow.drop_schedule('privileges-drop')$$),
    ('fire_schedules', '{runrow_worker}', $$SELECT runrow.fire_schedules()$$),
    ('fire_schedules_pass', '{runrow_worker}', $$SELECT * FROM runrow.fire_schedules_pass()$$),
    ('fork_run', '{runrow_client}', format($$SELECT * FROM runrow.fork_run(%L, 0)$$, :'done')),
    ('get_run_request', '{runrow_worker,runrow_client}', format($$SELECT * FROM runrow.get_run_request(%L)$$, :'done')),
    ('schema_version', '{runrow_worker,runrow_client,runrow_auditor}', $$SELECT runrow.schema_version()$$),
    ('events_channel', '{runrow_worker,runrow_client,runrow_auditor}',
        $$SELECT runrow.events_channel(gen_random_uuid())$$),
    ('acquire_model_call', '{runrow_worker}',
        $$SELECT * FROM runrow.acquire_model_call(gen_random_uuid(), gen_random_uuid(), 10)$$),
    ('report_rate_limited', '{runrow_worker}',
        $$SELECT runrow.report_rate_limited(gen_random_uuid(), gen_random_uuid(), 10)$$),
    ('report_rate_limit_exhausted', '{runrow_worker}',
        $$SELECT runrow.report_rate_limit_exhausted(gen_random_uuid(), gen_random_uuid(), 10)$$),
    ('report_key_error', '{runrow_worker}',
        $$SELECT runrow.report_key_error(gen_random_uuid(), gen_random_uuid(), 'invalid x-api-key')$$),
    ('set_rate_limit', '{}', $$SELECT runrow.set_rate_limit('pgtap-key', 1, 1, 1)$$),
    ('set_tenant_budget', '{}', $$SELECT runrow.set_tenant_budget('pgtap-tenant', 1, NULL)$$),
    ('update_tenant_budget', '{}', $$SELECT runrow.update_tenant_budget('pgtap-tenant', 1)$$),
    ('update_rate_limit', '{}', $$SELECT runrow.update_rate_limit('pgtap-key', 2)$$),
    ('set_model_price', '{}', $$SELECT runrow.set_model_price('pgtap-model', 1, 1, 1, 1)$$),
    ('watch_runs', '{runrow_worker,runrow_client}', format($$SELECT * FROM runrow.watch_runs(ARRAY[%L]::uuid[])$$, :'done')),
    ('notify_probe', '{runrow_worker,runrow_client}',
        $$SELECT runrow.notify_probe('runrow_probe_' || md5(random()::text))$$);

CREATE TEMP TABLE roles (role name PRIMARY KEY);
INSERT INTO roles VALUES ('runrow_worker'), ('runrow_client'), ('runrow_auditor');

-- Every base table of the schema, including the ones later migrations add.
CREATE TEMP TABLE tables AS
SELECT c.relname AS tab, a.attname AS col
FROM pg_class AS c
JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum = 1
WHERE c.relnamespace = 'runrow'::regnamespace AND c.relkind IN ('r', 'p');

-- The private helpers: every runrow function whose name starts with an underscore
-- (_claim, _end_claim, _stop_run, the _helpers file's _journal, _wake_tails, ...).
CREATE TEMP TABLE private AS
SELECT p.oid::regprocedure AS sig, p.proname AS fn FROM pg_proc AS p
WHERE p.pronamespace = 'runrow'::regnamespace AND p.proname LIKE '\_%';

SELECT plan(
    (SELECT count(*)::int * 3 FROM api)      -- each role x each API function
    + (SELECT count(*)::int * 3 * 5 FROM tables)  -- each role x each table x SELECT/INSERT/UPDATE/DELETE/TRUNCATE
    + 3                                      -- private helpers, by privilege, per role
    + 8                                      -- private helpers called under SET ROLE
    + 4                                      -- PUBLIC and a role without memberships
    + 2                                      -- search_path pinned; the functions really are SECURITY DEFINER
    + 1                                      -- no SET clause on the private helpers
    + 5                                      -- claim tokens: the auditor reads every column but them
    + 1                                      -- the worker reads the priced models (metrics labels)
);

-- Each role x each API function, for real under SET ROLE.
CREATE FUNCTION pg_temp.api_tests() RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE t record;
BEGIN
    FOR t IN SELECT * FROM api CROSS JOIN roles ORDER BY api.fn, roles.role LOOP
        IF t.role = ANY (t.roles) THEN
            RETURN NEXT lives_ok(format('SELECT pg_temp.as_role(%L, %L)', t.role, t.call),
                format('%s can execute %s', t.role, t.fn));
        ELSE
            RETURN NEXT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', t.role, t.call), '42501',
                format('permission denied for function %s', t.fn), format('%s cannot execute %s', t.role, t.fn));
        END IF;
    END LOOP;
END $$;
SELECT * FROM pg_temp.api_tests();

-- Invariant 6: no role writes a table; only the auditor reads them.
CREATE FUNCTION pg_temp.table_tests() RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE t record;
BEGIN
    FOR t IN SELECT * FROM tables CROSS JOIN roles ORDER BY tables.tab, roles.role LOOP
        IF t.role = 'runrow_auditor' AND t.tab NOT LIKE '\_%' AND t.tab NOT LIKE 'yoyo%' THEN
            RETURN NEXT lives_ok(format('SELECT pg_temp.as_role(%L, %L)', t.role,
                format('SELECT count(*) FROM runrow.%I', t.tab)),
                format('%s can SELECT from %s', t.role, t.tab));
        ELSE
            RETURN NEXT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', t.role,
                format('SELECT count(*) FROM runrow.%I', t.tab)), '42501',
                format('permission denied for table %s', t.tab), format('%s cannot SELECT from %s', t.role, t.tab));
        END IF;
        RETURN NEXT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', t.role,
            format('INSERT INTO runrow.%I DEFAULT VALUES', t.tab)), '42501',
            format('permission denied for table %s', t.tab), format('%s cannot INSERT into %s', t.role, t.tab));
        RETURN NEXT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', t.role,
            format('UPDATE runrow.%I SET %I = %I', t.tab, t.col, t.col)), '42501',
            format('permission denied for table %s', t.tab), format('%s cannot UPDATE %s', t.role, t.tab));
        RETURN NEXT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', t.role,
            format('DELETE FROM runrow.%I', t.tab)), '42501',
            format('permission denied for table %s', t.tab), format('%s cannot DELETE from %s', t.role, t.tab));
        RETURN NEXT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', t.role,
            format('TRUNCATE runrow.%I', t.tab)), '42501',
            format('permission denied for table %s', t.tab), format('%s cannot TRUNCATE %s', t.role, t.tab));
    END LOOP;
END $$;
SELECT * FROM pg_temp.table_tests();

-- A claim token is the capability that fences a run's or a delivery's lease, not something to
-- look at: the auditor reads every other column (migration 0073), and what it reads through
-- the views and audit(), which run as the owner, is unchanged.
SELECT is_empty($$SELECT a.attrelid::regclass, a.attname FROM pg_attribute AS a
    JOIN pg_class AS c ON c.oid = a.attrelid
    WHERE c.relnamespace = 'runrow'::regnamespace AND c.relkind IN ('r', 'p')
      AND a.attname IN ('claim_token', 'lapsed_claim_token', 'reported_429s_claim') AND NOT a.attisdropped
      AND has_column_privilege('runrow_auditor', a.attrelid, a.attnum, 'SELECT')$$,
    'runrow_auditor can read no claim_token column, nor webhook_delivery.lapsed_claim_token (0102) '
    'nor agent_run.reported_429s_claim (0106)');
SELECT throws_ok($$SELECT pg_temp.as_role('runrow_auditor', 'SELECT claim_token FROM runrow.agent_run')$$,
    '42501', 'permission denied for table agent_run', 'the auditor cannot SELECT agent_run.claim_token');
SELECT throws_ok($$SELECT pg_temp.as_role('runrow_auditor', 'SELECT claim_token FROM runrow.webhook_delivery')$$,
    '42501', 'permission denied for table webhook_delivery', 'the auditor cannot SELECT webhook_delivery.claim_token');
SELECT lives_ok(format('SELECT pg_temp.as_role(%L, %L)', 'runrow_auditor', string_agg(format(
        'SELECT count(*) FROM (SELECT %s FROM runrow.%I) AS c', cols, tab), ' UNION ALL ')),
    'the auditor still reads every other column of agent_run and webhook_delivery')
FROM (SELECT c.relname AS tab, string_agg(quote_ident(a.attname), ', ') AS cols
      FROM pg_class AS c JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      WHERE c.oid IN ('runrow.agent_run'::regclass, 'runrow.webhook_delivery'::regclass)
        AND a.attname NOT IN ('claim_token', 'lapsed_claim_token', 'reported_429s_claim')
      GROUP BY c.relname) AS t;
SELECT lives_ok($$SELECT pg_temp.as_role('runrow_auditor', 'SELECT 1 FROM runrow.queue_health, runrow.run_stats,
        runrow.run_attempts, runrow.webhook_health, (SELECT count(*) FROM runrow.webhook_outbox) AS o,
        (SELECT count(*) FROM runrow.audit()) AS a')$$,
    'the auditor still reads the views over them and runs audit()');

-- The worker's metrics label only the models the operator priced (migration 0074).
SELECT lives_ok($$SELECT pg_temp.as_role('runrow_worker', 'SELECT model FROM runrow.model_prices')$$,
    'the worker reads runrow.model_prices');

-- Private helpers: no runrow role holds EXECUTE on any of them.
SELECT is_empty(format($$SELECT sig FROM private WHERE has_function_privilege(%L, sig, 'EXECUTE')$$, role),
    format('%s cannot execute any private helper (_claim, _end_claim, _stop_run, the _helpers file)', role))
FROM roles ORDER BY role;
SELECT throws_ok($$SELECT pg_temp.as_role('runrow_worker', 'SELECT * FROM runrow._claim(''w'', 1, 30)')$$,
    '42501', 'permission denied for function _claim', 'the worker cannot call _claim around claim_run''s checks');
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', 'runrow_worker',
        format('SELECT runrow._end_claim(%L, NULL, NULL, NULL, NULL)', :'done')),
    '42501', 'permission denied for function _end_claim', 'the worker cannot call _end_claim directly');
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', 'runrow_client', format('SELECT runrow._stop_run(%L)', :'done')),
    '42501', 'permission denied for function _stop_run', 'the client cannot call _stop_run directly');
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', 'runrow_worker',
        format($$SELECT runrow._journal(%L, '[{"type": "complete"}]')$$, :'done')),
    '42501', 'permission denied for function _journal', 'the worker cannot call _journal (from _helpers) to forge events');
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', 'runrow_client',
        format($$SELECT runrow._journal_complete(%L, gen_random_uuid(), 'completed', NULL, NULL)$$, :'done')),
    '42501', 'permission denied for function _journal_complete', 'the client cannot call _journal_complete (from _helpers)');
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', 'runrow_worker',
        format($$SELECT runrow._append_step(%L, 'model_turn', '[{"type": "text", "text": "x"}]', NULL)$$, :'done')),
    '42501', 'permission denied for function _append_step',
    'the worker cannot call _append_step (from _steps_helpers) around append_step''s fence');
SELECT throws_ok($$SELECT pg_temp.as_role('runrow_auditor', 'SELECT runrow._pin_prompt(''x'', ''[]'')')$$,
    '42501', 'permission denied for function _pin_prompt', 'the auditor cannot call _pin_prompt (from _helpers)');
SELECT throws_ok($$SELECT pg_temp.as_role('runrow_auditor', 'SELECT runrow._lock_conversation(gen_random_uuid())')$$,
    '42501', 'permission denied for function _lock_conversation', 'the auditor cannot call _lock_conversation (from _helpers)');

-- PUBLIC executes nothing in runrow: checked through the PUBLIC pseudo-role and through a
-- fresh role with no memberships (which has only what PUBLIC has).
CREATE ROLE pgtap_nobody NOLOGIN;
SELECT is_empty($$SELECT p.oid::regprocedure FROM pg_proc AS p
    WHERE p.pronamespace = 'runrow'::regnamespace AND has_function_privilege('public', p.oid, 'EXECUTE')$$,
    'PUBLIC has EXECUTE on no runrow function');
SELECT is_empty($$SELECT p.oid::regprocedure FROM pg_proc AS p
    WHERE p.pronamespace = 'runrow'::regnamespace AND has_function_privilege('pgtap_nobody', p.oid, 'EXECUTE')$$,
    'a role without memberships has EXECUTE on no runrow function');
SELECT is_empty($$SELECT c.oid::regclass FROM pg_class AS c
    WHERE c.relnamespace = 'runrow'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
      AND has_table_privilege('pgtap_nobody', c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE')$$,
    'a role without memberships has no privilege on any runrow table or view');
SELECT throws_ok($$SELECT pg_temp.as_role('pgtap_nobody', 'SELECT runrow.schema_version()')$$,
    '42501', 'permission denied for schema runrow', 'a role without memberships cannot even reach the schema');

-- SECURITY DEFINER functions run as the owner: each must pin its search_path, without
-- the caller-controlled schemas and with pg_temp named last (unnamed, it is searched first for
-- tables and types: pgtap/search_path_hijack.sql), or a caller could shadow the names it uses.
SELECT is_empty($$SELECT p.oid::regprocedure FROM pg_proc AS p
    WHERE p.pronamespace = 'runrow'::regnamespace AND p.prosecdef
      AND NOT EXISTS (
          SELECT 1 FROM unnest(p.proconfig) AS c (setting)
          WHERE c.setting LIKE 'search\_path=%'
            AND c.setting = 'search_path=pg_catalog, runrow, pg_temp')$$,
    'every SECURITY DEFINER function in runrow pins its search_path to pg_catalog, runrow, pg_temp');
SELECT set_eq($$SELECT p.proname::text FROM pg_proc AS p
    WHERE p.pronamespace = 'runrow'::regnamespace AND p.prosecdef AND p.proname IN (SELECT fn FROM api)$$,
    $$SELECT fn::text FROM api WHERE fn <> 'events_channel'$$,
    'every lifecycle function granted to a role is SECURITY DEFINER (events_channel is a pure formatter)');

-- The private helpers run under their callers' pinned search_path and carry no SET clause of
-- their own, a settings save and restore per call (issue 11). Kept: _claim's plan settings,
-- the schedule helpers (once per reaper pass) and the trigger functions (they fire under any
-- writer's settings). _uuidv7, a column default evaluated by whichever session inserts, has
-- none since 0055: its standard body was bound to pg_catalog when it was created.
SELECT is_empty($$SELECT p.oid::regprocedure FROM pg_proc AS p
    WHERE p.pronamespace = 'runrow'::regnamespace AND p.proname LIKE '\_%' AND NOT p.prosecdef
      AND p.prorettype <> 'trigger'::regtype AND p.proconfig IS NOT NULL
      AND p.proname NOT IN ('_claim', '_fire_schedules', '_fire_schedules_pass', '_schedule_conversation', '_schedule_tick_key')
      AND p.proname NOT LIKE '\_cron\_%'$$,
    'no private helper carries a SET clause but _claim and the schedule helpers');
SELECT * FROM finish();
ROLLBACK;
