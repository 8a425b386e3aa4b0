-- The bad-input helpers of functions/_helpers.sql and _limits_helpers.sql (_require_not_null,
-- _require_range, _require_delay, _require_key, _require_positive, _require_seconds,
-- _require_tenant_budget, _require_rate_limit), called as
-- the owner (no runrow role may). Each passes a good value and raises for a bad one with its
-- SQLSTATE and the argument named; every public function's own file tests them through its
-- arguments. They carry no SET clause: a settings save and restore on each call, under callers
-- that pin search_path already (issue 11).
BEGIN;
\ir helpers/setup.psql
\set QUIET 1
SELECT plan(39);

SELECT is_empty($$SELECT p.oid::regprocedure FROM pg_proc AS p
    WHERE p.pronamespace = 'runrow'::regnamespace AND p.proname LIKE '\_require\_%' AND p.proconfig IS NOT NULL$$,
    'no _require_* helper has a SET clause');
SELECT is((SELECT count(*)::int FROM pg_proc AS p
    WHERE p.pronamespace = 'runrow'::regnamespace AND p.proname LIKE '\_require\_%'), 14,
    'the fourteen helpers exist (the request checks of _request_checks.sql are tested in request_checks.sql, '
    '_require_printable in identifiers_printable.sql)');
SELECT is_empty($$SELECT p.oid::regprocedure FROM pg_proc AS p
    WHERE p.pronamespace = 'runrow'::regnamespace AND p.proname LIKE '\_require\_%'
      AND (p.prosecdef OR has_function_privilege('runrow_worker', p.oid, 'EXECUTE')
           OR has_function_privilege('runrow_client', p.oid, 'EXECUTE'))$$,
    'no helper is SECURITY DEFINER or callable by a runrow role');

-- _require_not_null
SELECT lives_ok($$SELECT runrow._require_not_null('x'::text, 'name')$$, 'not_null: a value passes');
SELECT throws_ok($$SELECT runrow._require_not_null(NULL::uuid, 'run_id')$$, '22004',
    'run_id must not be NULL', 'not_null: NULL raises 22004 naming the argument');

-- _require_range
SELECT lives_ok($$SELECT runrow._require_range(1, 'max_runs', 1, 1000)$$, 'range: the low end passes');
SELECT lives_ok($$SELECT runrow._require_range(1000, 'max_runs', 1, 1000)$$, 'range: the high end passes');
SELECT throws_ok($$SELECT runrow._require_range(NULL, 'max_runs', 1, 1000)$$, '22004',
    'max_runs must not be NULL', 'range: NULL raises 22004');
SELECT throws_ok($$SELECT runrow._require_range(0, 'max_runs', 1, 1000)$$, '22023',
    'max_runs must be between 1 and 1000, got 0', 'range: below raises 22023 with the bounds');
SELECT throws_ok($$SELECT runrow._require_range(1001, 'max_runs', 1, 1000)$$, '22023',
    'max_runs must be between 1 and 1000, got 1001', 'range: above raises 22023');

-- _require_delay
SELECT lives_ok($$SELECT runrow._require_delay(NULL, 'start_in', interval '1 day')$$, 'delay: NULL is none');
SELECT lives_ok($$SELECT runrow._require_delay(interval '1 day', 'start_in', interval '1 day')$$,
    'delay: the limit passes');
SELECT throws_ok($$SELECT runrow._require_delay(interval '0', 'start_in', interval '1 day')$$, '22023',
    'start_in must be NULL or more than 0 and at most 1 day, got 00:00:00', 'delay: zero raises');
SELECT throws_ok($$SELECT runrow._require_delay(interval '25 hours', 'start_in', interval '1 day')$$, '22023',
    'start_in must be NULL or more than 0 and at most 1 day, got 25:00:00', 'delay: over the limit raises');
-- Judged where the delay lands, now() + value on the calendar, as not_before is: an interval's
-- comparison counts a month as 30 days and a year as 360 (the SQL audit: '1 mon -29 days -23
-- hours' passed for at most 1 day and deferred a run 1 day 00:59:59; '1 year 6 days' passed for
-- at most 366 days and landed 371 days out). Each value below lands wrong on any date.
SELECT throws_ok($$SELECT runrow._require_delay(interval '1 year -359 days', 'retry_in', interval '1 day')$$,
    '22023', 'retry_in must be NULL or more than 0 and at most 1 day, got 1 year -359 days',
    'delay: compares as 1 day, lands 6 or 7 days out: raises');
SELECT throws_ok($$SELECT runrow._require_delay(interval '1 year 6 days', 'start_in', interval '366 days')$$,
    '22023', 'start_in must be NULL or more than 0 and at most 366 days, got 1 year 6 days',
    'delay: compares as 366 days, lands 371 or 372 days out: raises');
SELECT throws_ok($$SELECT runrow._require_delay(interval '-1 year 361 days', 'retry_in', interval '1 day')$$,
    '22023', 'retry_in must be NULL or more than 0 and at most 1 day, got -1 years +361 days',
    'delay: compares as 1 day, lands 4 or 5 days in the past: raises');
SELECT throws_ok($$SELECT runrow._require_delay(interval '300000 years -107999999 days', 'retry_in', interval '1 day')$$,
    '22023', 'retry_in must be NULL or more than 0 and at most 1 day, got 300000 years -107999999 days',
    'delay: compares as 1 day, lands past the end of time: 22023 naming it, not 22008');
SELECT lives_ok($$SELECT runrow._require_delay(interval '24 hours', 'retry_in', interval '1 day')$$,
    'delay: 24 hours is a day');
SELECT lives_ok($$SELECT runrow._require_delay(interval '1 year', 'start_in', interval '366 days')$$,
    'delay: a year is at most 366 days');
-- _delay_plain: the callers' inlined test that spares the helper for what clients send.
SELECT ok(runrow._delay_plain(interval '90 seconds', interval '1 day') AND runrow._delay_plain(NULL, interval '1 day'),
    'delay_plain: a time within the limit, or NULL, needs no helper');
SELECT ok(NOT runrow._delay_plain(interval '1 day', interval '1 day'),
    'delay_plain: days are the helper''s to judge (a calendar day may be 23 or 25 hours)');
SELECT ok(NOT runrow._delay_plain(interval '1 mon -29 days', interval '1 day')
    AND NOT runrow._delay_plain(interval '1 year -359 days', interval '1 day'),
    'delay_plain: so are months and years');
SELECT ok(NOT runrow._delay_plain(interval '0', interval '1 day')
    AND NOT runrow._delay_plain(interval '25 hours', interval '1 day'),
    'delay_plain: zero and over the limit are the helper''s to refuse');

-- _require_key
SELECT lives_ok($$SELECT runrow._require_key(NULL, 'fairness_key')$$, 'key: NULL is none');
SELECT lives_ok($$SELECT runrow._require_key(repeat('k', 200), 'fairness_key')$$, 'key: 200 characters pass');
SELECT throws_ok($$SELECT runrow._require_key('', 'fairness_key')$$, '22023',
    'fairness_key must be NULL or 1 to 200 characters', 'key: empty raises');
SELECT throws_ok($$SELECT runrow._require_key(repeat('k', 201), 'fairness_key')$$, '22023',
    'fairness_key must be NULL or 1 to 200 characters', 'key: 201 characters raise');

-- _require_positive (tested with the other limits helpers in limits_helpers.sql)
SELECT throws_ok($$SELECT runrow._require_positive(-1, 'cost_per_day')$$, '22023',
    'cost_per_day must be NULL or a finite number more than 0, got -1', 'positive: a negative value raises');

-- _require_seconds (the waits report_rate_limited and report_rate_limit_exhausted take)
SELECT lives_ok($$SELECT runrow._require_seconds(60, 'reset_in_seconds', 60)$$, 'seconds: the most passes');
SELECT throws_ok($$SELECT runrow._require_seconds(0, 'reset_in_seconds', 60)$$, '22023',
    'reset_in_seconds must be more than 0 and at most 60, got 0', 'seconds: 0 raises 22023 with the bound');
SELECT throws_ok($$SELECT runrow._require_seconds(60.5, 'reset_in_seconds', 60)$$, '22023',
    'reset_in_seconds must be more than 0 and at most 60, got 60.5', 'seconds: over the most raises');
SELECT throws_ok($$SELECT runrow._require_seconds('NaN', 'reset_in_seconds', 60)$$, '22023',
    'reset_in_seconds must be more than 0 and at most 60, got NaN', 'seconds: NaN raises');

-- _require_tenant_budget: set_tenant_budget's and update_tenant_budget's arguments.
SELECT lives_ok($$SELECT runrow._require_tenant_budget('acme', NULL, 25)$$, 'tenant_budget: a key and a budget pass');
SELECT throws_ok($$SELECT runrow._require_tenant_budget(NULL, 1, NULL)$$, '22004',
    'fairness_key must not be NULL', 'tenant_budget: a NULL key raises 22004');
SELECT throws_ok($$SELECT runrow._require_tenant_budget('acme', 0, NULL)$$, '22023',
    'tokens_per_day must be NULL or a finite number more than 0, got 0', 'tenant_budget: a budget of 0 raises 22023');

-- _require_rate_limit: set_rate_limit's and update_rate_limit's arguments.
SELECT lives_ok($$SELECT runrow._require_rate_limit('k', 50, NULL, 8000)$$, 'rate_limit: a key and limits pass');
SELECT throws_ok($$SELECT runrow._require_rate_limit(NULL, 1, NULL, NULL)$$, '22004',
    'rate_limit_key must not be NULL', 'rate_limit: a NULL key raises 22004');
SELECT throws_ok($$SELECT runrow._require_rate_limit('k', NULL, NULL, 0)$$, '22023',
    'output_tokens_per_minute must be NULL or a finite number more than 0, got 0', 'rate_limit: a limit of 0 raises 22023');

SELECT * FROM finish();
ROLLBACK;
