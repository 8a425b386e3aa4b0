-- runrow.enqueue_run's fleet-scheduling arguments (SPEC "Fleet scheduling"): stored on the
-- run as given or resolved (fairness_key -> user_id, rate_limit_key -> model), start_in as a
-- not_before from the database clock, in the idempotency fingerprint only when given, and
-- bad values refused with 22023/22004 naming the argument, nothing written.
BEGIN;
\ir helpers/setup.psql
\ir helpers/row_versions.psql
SELECT plan(38);
SELECT pg_temp.drain_queue();

-- Defaults: old calls are unchanged, and the resolved keys are the user and the model.
SELECT run_id AS plain FROM runrow.enqueue_run(
    conversation_id => gen_random_uuid(), content => '"hi"', model => 'claude-x', user_id => 'u-plain') \gset
SELECT is(
    (SELECT (not_before, priority, fairness_key, concurrency_key, rate_limit_key, token_budget,
             cost_budget, webhook_url)::text FROM runrow.agent_run WHERE id = :'plain'),
    (NULL::timestamptz, 0, 'u-plain', NULL::text, 'claude-x', NULL::bigint, NULL::numeric, NULL::text)::text,
    'no fleet arguments: claimable at once, priority 0, fair across the user, limited by the model');
SELECT is(
    (SELECT payload FROM runrow.run_event WHERE run_id = :'plain' AND type = 'run_queued'),
    jsonb_build_object('type', 'run_queued', 'run_id', :'plain'::uuid),
    'run_queued is as before when no delay is asked for');
SELECT is((SELECT fairness_key FROM runrow.agent_run WHERE id = pg_temp.new_run()), NULL,
    'a run without a user belongs to the anonymous tenant (NULL)');

-- Every argument given.
SELECT run_id AS full_run FROM runrow.enqueue_run(
    conversation_id => gen_random_uuid(), content => '"hi"', model => 'claude-x', user_id => 'u1',
    start_in => interval '90 seconds', priority => 7, fairness_key => 'org-7',
    concurrency_key => 'tools-heavy', rate_limit_key => 'api-key-2', token_budget => 2000,
    cost_budget => 0.25, webhook_url => 'https://example.test/hooks/run?x=1') \gset
SELECT is(
    (SELECT (not_before = now() + interval '90 seconds', priority, fairness_key, concurrency_key,
             rate_limit_key, token_budget, cost_budget, webhook_url)::text
     FROM runrow.agent_run WHERE id = :'full_run'),
    (true, 7, 'org-7', 'tools-heavy', 'api-key-2', 2000::bigint, 0.25::numeric,
     'https://example.test/hooks/run?x=1')::text,
    'every fleet argument is stored; start_in is now() + start_in by the database clock');
SELECT is(
    (SELECT payload FROM runrow.run_event WHERE run_id = :'full_run' AND type = 'run_queued'),
    jsonb_build_object('type', 'run_queued', 'run_id', :'full_run'::uuid,
                       'not_before', now() + interval '90 seconds'),
    'a delayed run''s run_queued says from when it is claimable');
SELECT is((SELECT status FROM runrow.agent_run WHERE id = :'full_run'), 'queued', 'a delayed run is queued');

-- Idempotency: a replay repeats the fleet arguments; a change of one is another request.
\set conv '''cccccccc-0000-0000-0000-000000000013'''
SELECT run_id AS keyed FROM runrow.enqueue_run(
    conversation_id => :conv, content => '"hi"', model => 'claude-x', idempotency_key => 'fleet-key',
    priority => 3, token_budget => 100) \gset
SELECT pg_temp.written() AS before \gset
SELECT is(
    (SELECT (run_id, created)::text FROM runrow.enqueue_run(
        conversation_id => :conv, content => '"hi"', model => 'claude-x', idempotency_key => 'fleet-key',
        priority => 3, token_budget => 100)),
    (:'keyed'::uuid, false)::text, 'the same request with the same fleet arguments replays');
SELECT throws_ok(
    format($$SELECT * FROM runrow.enqueue_run(conversation_id => %L, content => '"hi"', model => 'claude-x',
        idempotency_key => 'fleet-key', priority => 4, token_budget => 100)$$, :conv),
    '23505', NULL, 'the key with another priority is another request: 23505');
SELECT throws_ok(
    format($$SELECT * FROM runrow.enqueue_run(conversation_id => %L, content => '"hi"', model => 'claude-x',
        idempotency_key => 'fleet-key', priority => 3)$$, :conv),
    '23505', NULL, 'the key without the token budget is another request: 23505');
SELECT is(pg_temp.written(), :'before', 'the replay and the refusals wrote nothing');

-- Bad input: SQLSTATE and the argument's name, nothing written.
CREATE FUNCTION pg_temp.bad(args text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format($q$SELECT * FROM runrow.enqueue_run(conversation_id => gen_random_uuid(),
        content => '"hi"', model => 'm', %s)$q$, args);
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
SELECT pg_temp.written() AS before \gset
SELECT matches(pg_temp.bad($$start_in => interval '0'$$), '^22023: start_in must be',
    'a zero start_in is refused (22023 naming start_in)');
SELECT matches(pg_temp.bad($$start_in => interval '-5 seconds'$$), '^22023: start_in must be',
    'a negative start_in is refused');
SELECT matches(pg_temp.bad($$start_in => interval '400 days'$$), '^22023: start_in must be',
    'a start_in beyond 366 days is refused');
SELECT matches(pg_temp.bad($$start_in => interval '1 year 6 days'$$), '^22023: start_in must be',
    'a start_in that compares as 366 days but lands 371 or 372 days out is refused');
SELECT matches(pg_temp.bad($$priority => 1001$$), '^22023: priority must be between -1000 and 1000',
    'a priority out of range is refused');
SELECT matches(pg_temp.bad($$priority => NULL$$), '^22004: priority must not be NULL',
    'a NULL priority is refused (22004)');
SELECT matches(pg_temp.bad($$fairness_key => ''$$), '^22023: fairness_key must be NULL or 1 to 200',
    'an empty fairness_key is refused');
SELECT matches(pg_temp.bad(format('concurrency_key => %L', repeat('k', 201))),
    '^22023: concurrency_key must be NULL or 1 to 200', 'a 201-character concurrency_key is refused');
SELECT matches(pg_temp.bad($$rate_limit_key => ''$$), '^22023: rate_limit_key must be NULL or 1 to 200',
    'an empty rate_limit_key is refused');
SELECT matches(pg_temp.bad($$token_budget => 0$$), '^22023: token_budget must be NULL or a positive',
    'a zero token_budget is refused');
SELECT matches(pg_temp.bad($$token_budget => -10$$), '^22023: token_budget must be NULL or a positive',
    'a negative token_budget is refused');
SELECT matches(pg_temp.bad($$cost_budget => 0$$), '^22023: cost_budget must be NULL or a finite, positive',
    'a zero cost_budget is refused');
SELECT matches(pg_temp.bad($$cost_budget => 'NaN'$$), '^22023: cost_budget must be NULL or a finite, positive',
    'a NaN cost_budget is refused (NaN sorts above every number, so it passed > 0)');
SELECT matches(pg_temp.bad($$cost_budget => 'Infinity'$$), '^22023: cost_budget must be NULL or a finite, positive',
    'an infinite cost_budget is refused');
SELECT matches(pg_temp.bad($$webhook_url => 'ftp://example.test/x'$$), '^22023: webhook_url must be',
    'a non-http webhook_url is refused');
SELECT matches(pg_temp.bad($$webhook_url => 'https://exa mple.test/'$$), '^22023: webhook_url must be',
    'a webhook_url with a space is refused');
SELECT matches(pg_temp.bad(format('webhook_url => %L', 'https://x.test/' || repeat('a', 2040))),
    '^22023: webhook_url must be', 'a webhook_url over 2048 characters is refused');
-- URLs no request can be sent to: each delivery attempt failed the same way after a 202.
SELECT is(ARRAY[pg_temp.bad($$webhook_url => 'http://e.test:abc/'$$), pg_temp.bad($$webhook_url => 'http://[::1/'$$),
        pg_temp.bad($$webhook_url => 'http:///hook'$$), pg_temp.bad($$webhook_url => 'http://e.test:99999/'$$),
        pg_temp.bad($$webhook_url => 'http://e.test:0/'$$)],
    ARRAY['22023: webhook_url must be NULL or an http:// or https:// URL of at most 2048 characters with a host, '
        || 'and a port from 1 to 65535 if it names one, got "http://e.test:abc/"', '22023: ' || 'webhook_url must be NULL '
        || 'or an http:// or https:// URL of at most 2048 characters with a host, and a port from 1 to 65535 if it '
        || 'names one, got "http://[::1/"', '22023: webhook_url must be NULL or an http:// or https:// URL of at most '
        || '2048 characters with a host, and a port from 1 to 65535 if it names one, got "http:///hook"',
        '22023: webhook_url must be NULL or an http:// or https:// URL of at most 2048 characters with a host, and a '
        || 'port from 1 to 65535 if it names one, got "http://e.test:99999/"', '22023: webhook_url must be NULL or an '
        || 'http:// or https:// URL of at most 2048 characters with a host, and a port from 1 to 65535 if it names '
        || 'one, got "http://e.test:0/"'],
    'a webhook_url with a port that is not one, an unclosed IPv6 bracket or no host is refused, named');
SELECT is(pg_temp.written(), :'before', 'no refused enqueue wrote anything');
SELECT is(ARRAY[pg_temp.bad($$webhook_url => 'http://[::1]:8080/hook?x=1#y'$$),
        pg_temp.bad($$webhook_url => 'https://user:pw@hooks.e.test:65535'$$),
        pg_temp.bad($$webhook_url => 'http://127.0.0.1:9/'$$), pg_temp.bad($$webhook_url => 'https://é.test/h'$$)],
    array_fill('no error'::text, ARRAY[4]), 'IPv6 hosts, user info, ports up to 65535 and IDN hosts are taken');
SELECT pg_temp.written() AS before \gset

CREATE FUNCTION pg_temp.direct_url(url text, run uuid) RETURNS text LANGUAGE plpgsql AS $$
DECLARE state text; con text;
BEGIN
    UPDATE runrow.agent_run SET webhook_url = url WHERE id = run;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, con = CONSTRAINT_NAME;
    RETURN state || ' ' || con;
END $$;

-- The table's own rules hold for writes that bypass the function (the agent_run_settings
-- trigger since 0034, with the CHECK constraints' names and errors).
SELECT throws_ok(format('UPDATE runrow.agent_run SET priority = 5000 WHERE id = %L', :'plain'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_priority_range"',
    'agent_run_priority_range holds for a direct update');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET webhook_url = 'mailto:x' WHERE id = %L$$, :'plain'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_webhook_url_http"',
    'agent_run_webhook_url_http holds for a direct update');
-- The table's rule is enqueue_run's (_webhook_url_ok): a URL no request can be built for is
-- refused whoever writes it (the rule used to take any http(s):// text without white space).
SELECT is(ARRAY(SELECT pg_temp.direct_url(u, :'plain') FROM unnest(ARRAY['http://e.test:abc/', 'http://[::1/',
        'http:///hook', 'http://e.test:99999/', 'http://e.test:0/']) AS u),
    array_fill('23514 agent_run_webhook_url_http'::text, ARRAY[5]),
    'agent_run_webhook_url_http refuses a bad port, an unclosed IPv6 bracket and no host for a direct update');
SELECT is(ARRAY(SELECT pg_temp.direct_url(u, :'plain') FROM unnest(ARRAY['http://[::1]:8080/hook?x=1#y',
        'https://user:pw@hooks.e.test:65535', 'https://é.test/h']) AS u),
    array_fill('no error'::text, ARRAY[3]), 'and takes what enqueue_run takes');
SELECT throws_ok(format($$INSERT INTO runrow.agent_run (conversation_id, user_id, user_message_id, model, prompt_id, max_attempts)
        SELECT conversation_id, user_id, user_message_id, model, prompt_id, 0 FROM runrow.agent_run WHERE id = %L$$, :'plain'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_max_attempts_check"',
    'and for a direct insert');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET forked_at_seq = 1 WHERE id = %L$$, :'plain'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_fork_names_its_step"',
    'agent_run_fork_names_its_step holds for a direct update');
SELECT lives_ok(format($$UPDATE runrow.agent_run SET fairness_key = NULL, token_budget = NULL WHERE id = %L$$, :'plain'),
    'NULL passes, as it passes a CHECK');
-- An UPDATE that assigns none of those columns (every claim, heartbeat and finish) does not
-- fire the trigger at all.
SET LOCAL track_functions = 'all';
SELECT coalesce(pg_stat_get_xact_function_calls('runrow._agent_run_settings'::regproc), 0) AS settings_before \gset
UPDATE runrow.agent_run SET updated_at = now(), not_before = NULL WHERE id = :'plain';
SELECT is(coalesce(pg_stat_get_xact_function_calls('runrow._agent_run_settings'::regproc), 0) - :settings_before,
    0::bigint, 'an update of other columns does not run the settings check');

SELECT * FROM finish();
ROLLBACK;
