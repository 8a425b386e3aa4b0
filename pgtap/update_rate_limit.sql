-- update_rate_limit: the limits given replace the key's, the ones left NULL keep theirs (none
-- for a new key), with set_rate_limit's rules for the bucket levels. Happy path, who may call
-- it, bad input (nothing written). The concurrent update of another limit is
-- tests/test_fleet_limits_cli.py's (two sessions).
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(28);

CREATE FUNCTION pg_temp.limits(key text) RETURNS text LANGUAGE sql AS $$
    SELECT (l.requests_per_minute, l.input_tokens_per_minute, l.output_tokens_per_minute)::text
    FROM runrow.rate_limit AS l WHERE l.rate_limit_key = key
$$;
CREATE FUNCTION pg_temp.levels(key text) RETURNS text LANGUAGE sql AS $$
    SELECT (l.requests_left, l.input_tokens_left, l.output_tokens_left)::text
    FROM runrow.rate_limit AS l WHERE l.rate_limit_key = key
$$;
CREATE FUNCTION pg_temp.rate_limits_fingerprint() RETURNS text LANGUAGE sql AS $$
    SELECT md5(coalesce(string_agg(to_jsonb(l)::text, '' ORDER BY l.rate_limit_key), '')) FROM runrow.rate_limit AS l
$$;

-- Happy path: a new key gets what is given and nothing else, with full buckets; each later
-- call changes only what it names.
SELECT lives_ok($$SELECT runrow.update_rate_limit('upd-key', requests_per_minute => 50)$$, 'a new key, requests only');
SELECT is(pg_temp.limits('upd-key'), '(50,,)', 'its tokens are not limited');
SELECT is(pg_temp.levels('upd-key'), '(50,0,0)', 'a new key starts full, as set_rate_limit''s');
SELECT lives_ok($$SELECT runrow.update_rate_limit('upd-key', input_tokens_per_minute => 30000)$$, 'then input only');
SELECT is(pg_temp.limits('upd-key'), '(50,30000,)', 'its requests limit stays');
SELECT is(pg_temp.levels('upd-key'), '(50,30000,0)', 'the newly limited bucket starts full');
SELECT lives_ok($$SELECT runrow.update_rate_limit('upd-key', NULL, NULL, 8000)$$, 'then output only');
SELECT is(pg_temp.limits('upd-key'), '(50,30000,8000)', 'the other two stay');
UPDATE runrow.rate_limit SET requests_left = 20, input_tokens_left = 1000 WHERE rate_limit_key = 'upd-key';
SELECT lives_ok($$SELECT runrow.update_rate_limit('upd-key', 10)$$, 'a lower requests limit');
SELECT is(pg_temp.levels('upd-key'), '(10,1000,8000)', 'the levels are kept, capped to the new limit');
SELECT is((SELECT (requests_per_minute, input_tokens_per_minute, output_tokens_per_minute)::text
    FROM runrow.rate_limits WHERE rate_limit_key = 'upd-key'), '(10,30000,8000)',
    'the rate_limits view shows it as set_rate_limit''s');

-- A key's block stays, and a requests bucket limited while it is blocked starts empty (a row
-- with only a block, as report_rate_limited leaves on a key without limits).
INSERT INTO runrow.rate_limit (rate_limit_key, blocked_until) VALUES ('upd-blocked', now() + interval '30 seconds');
SELECT lives_ok($$SELECT runrow.update_rate_limit('upd-blocked', 60, 1000)$$, 'limits for a blocked key');
SELECT is((SELECT (blocked_until = now() + interval '30 seconds')::text || pg_temp.levels('upd-blocked')
    FROM runrow.rate_limit WHERE rate_limit_key = 'upd-blocked'), 'true(0,1000,0)',
    'the block stays; its requests bucket is empty until the block ends');

-- A key removed (set_rate_limit with three NULLs) is a new key again.
SELECT runrow.set_rate_limit('upd-key', NULL, NULL, NULL);
SELECT lives_ok($$SELECT runrow.update_rate_limit('upd-key', output_tokens_per_minute => 500)$$, 'after a removal');
SELECT is(pg_temp.limits('upd-key') || pg_temp.levels('upd-key'), '(,,500)(0,0,500)', 'only what is given');

-- A pace a header block set (report_rate_limit_exhausted, on a key with no requests limit)
-- is the API's word, not a limit the operator set: a change of the tokens only keeps it and
-- the requests level it mirrors (set_rate_limit, which update_rate_limit called, ended it on
-- every call), and a requests limit given ends it, as set_rate_limit does.
CREATE FUNCTION pg_temp.pace(key text) RETURNS text LANGUAGE sql AS $$
    SELECT (l.paced_requests_per_minute, l.paced_requests_limit, l.paced_full_since IS NOT NULL, l.requests_left)::text
    FROM runrow.rate_limit AS l WHERE l.rate_limit_key = key
$$;
CREATE FUNCTION pg_temp.paced(key text) RETURNS void LANGUAGE sql AS $$
    UPDATE runrow.rate_limit SET paced_requests_per_minute = 12, paced_requests_limit = 50, requests_left = 3,
        paced_full_since = now(), refilled_at = now()
    WHERE rate_limit_key = key
$$;
SELECT runrow.update_rate_limit('upd-paced', input_tokens_per_minute => 1000);
SELECT pg_temp.paced('upd-paced');
SELECT runrow.update_rate_limit('upd-paced', input_tokens_per_minute => 2000);
SELECT is(pg_temp.limits('upd-paced') || pg_temp.pace('upd-paced'), '(,2000,)(12,50,t,3)',
    'an input tokens limit changed: the pace and its level stand');
SELECT runrow.update_rate_limit('upd-paced', NULL, NULL, 500);
SELECT is(pg_temp.limits('upd-paced') || pg_temp.pace('upd-paced'), '(,2000,500)(12,50,t,3)',
    'an output tokens limit added: the pace stands');
SELECT runrow.update_rate_limit('upd-paced', 40);
SELECT is(pg_temp.limits('upd-paced') || pg_temp.pace('upd-paced'), '(40,2000,500)(,,f,3)',
    'a requests limit given ends the pace (its bucket keeps its level, capped)');
SELECT runrow.set_rate_limit('upd-paced', NULL, 2000, 500);
SELECT pg_temp.paced('upd-paced');
SELECT runrow.set_rate_limit('upd-paced', NULL, 3000, 500);
SELECT is(pg_temp.pace('upd-paced'), '(,,f,0)', 'set_rate_limit, the whole, still ends it');

-- Who may call it: the owner only, as set_rate_limit (no runrow role sets limits).
SELECT throws_ok($$SELECT pg_temp.as_role('runrow_client', 'SELECT runrow.update_rate_limit(''upd-key'', 5)')$$,
    '42501', NULL, 'runrow_client may not change a limit');

-- Bad input: named by its argument, nothing written.
SELECT pg_temp.rate_limits_fingerprint() AS before \gset
SELECT throws_ok($$SELECT runrow.update_rate_limit('upd-key')$$, '22004',
    'requests_per_minute, input_tokens_per_minute or output_tokens_per_minute must be given: NULL keeps '
    'that limit as it is (set_rate_limit(rate_limit_key, NULL, NULL, NULL) removes the key''s limits)',
    'nothing to change');
SELECT throws_ok($$SELECT runrow.update_rate_limit(NULL, 5)$$, '22004', 'rate_limit_key must not be NULL',
    'a NULL key');
SELECT throws_ok($$SELECT runrow.update_rate_limit('', 5)$$, '22023',
    'rate_limit_key must be NULL or 1 to 200 characters', 'an empty key');
SELECT throws_ok($$SELECT runrow.update_rate_limit('upd-key', -1)$$, '22023',
    'requests_per_minute must be NULL or a finite number more than 0, got -1', 'a negative requests limit');
SELECT throws_ok($$SELECT runrow.update_rate_limit('upd-key', NULL, 0)$$, '22023',
    'input_tokens_per_minute must be NULL or a finite number more than 0, got 0', 'a zero input limit');
SELECT throws_ok($$SELECT runrow.update_rate_limit('upd-new', NULL, NULL, -5)$$, '22023',
    'output_tokens_per_minute must be NULL or a finite number more than 0, got -5', 'a negative output limit');
SELECT throws_ok(format('SELECT runrow.update_rate_limit(%L, 5)', E'upd\u202eevil'), '22023', NULL,
    'an unprintable key');
SELECT is(pg_temp.rate_limits_fingerprint(), :'before', 'bad input wrote nothing');

SELECT * FROM finish();
ROLLBACK;
