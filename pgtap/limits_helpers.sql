-- The private helpers of functions/_limits_helpers.sql, called as the owner (no runrow role may):
-- _require_positive, _usage_tokens, _lock_bucket (refill by the database clock, capped at a
-- minute's worth), _tenant_verdict (the hours overlapping the last 24 h) and _budget_verdict.
-- acquire_model_call, append_step and the claim use them; fleet_limits.sql tests those.
BEGIN;
\ir helpers/setup.psql
\set QUIET 1
SELECT plan(17);
SELECT pg_temp.drain_queue();

-- _require_positive: NULL is "no limit", zero or less is refused naming the argument.
SELECT lives_ok($$SELECT runrow._require_positive(NULL, 'requests_per_minute')$$, 'NULL is no limit');
SELECT lives_ok($$SELECT runrow._require_positive(0.5, 'requests_per_minute')$$, 'a positive value passes');
SELECT throws_ok($$SELECT runrow._require_positive(0, 'requests_per_minute')$$, '22023',
    'requests_per_minute must be NULL or a finite number more than 0, got 0', 'zero is refused, naming the argument');

-- _usage_tokens: a non-negative whole count, anything else costs nothing.
SELECT is(runrow._usage_tokens('{"input_tokens": 1200}', 'input_tokens'), 1200::bigint, 'a count');
SELECT is(runrow._usage_tokens('{"input_tokens": 12.7}', 'input_tokens'), 12::bigint, 'a fraction is floored');
SELECT is(runrow._usage_tokens('{"input_tokens": -5}', 'input_tokens'), 0::bigint, 'a negative count is 0');
SELECT is(runrow._usage_tokens('{"input_tokens": "9"}', 'input_tokens'), 0::bigint, 'a string is 0');
SELECT is(runrow._usage_tokens('{}', 'input_tokens'), 0::bigint, 'a missing field is 0');

-- _lock_bucket: no row, no limit; a bucket refills at its per-minute rate, at most a minute's worth.
SELECT is(runrow._lock_bucket('no-such-key'), NULL, 'a key without a row: NULL');
INSERT INTO runrow.rate_limit (rate_limit_key, requests_per_minute, requests_left, refilled_at)
VALUES ('half-minute', 60, 0, now() - interval '30 seconds'),
       ('long-idle', 60, 10, now() - interval '10 minutes');
SELECT is((runrow._lock_bucket('half-minute')).requests_left, 30::numeric,
    '30 s after an empty bucket, half of 60 requests per minute are back');
SELECT is((SELECT refilled_at FROM runrow.rate_limit WHERE rate_limit_key = 'half-minute'), now(),
    'the refill is stamped with the database clock');
SELECT is((runrow._lock_bucket('long-idle')).requests_left, 60::numeric,
    'a bucket idle for 10 minutes holds a minute''s worth, not more');
SELECT is((runrow._lock_bucket('half-minute')).requests_left, 30::numeric,
    'no time passed since the last refill: nothing more');

-- _tenant_verdict: the spend of the hours overlapping the last 24 h against the budget.
SELECT is(runrow._tenant_verdict('unbudgeted'), NULL, 'a tenant without a budget: no verdict');
INSERT INTO runrow.tenant_budget (fairness_key, tokens_per_day) VALUES ('org-1', 100);
INSERT INTO runrow.spend_hour (fairness_key, hour, model, tokens)
VALUES ('org-1', date_trunc('hour', now()) - interval '30 hours', 'm', 500),
       ('org-1', date_trunc('hour', now()) - interval '2 hours', 'm', 60);
SELECT is(runrow._tenant_verdict('org-1'), NULL, 'spend older than the rolling day does not count');
INSERT INTO runrow.spend_hour (fairness_key, hour, model, tokens)
VALUES ('org-1', date_trunc('hour', now()), 'm', 40);
SELECT is(runrow._tenant_verdict('org-1'), 'budget_exhausted: tenant "org-1" used 100 tokens of its 100 per day',
    'reaching the budget is a verdict naming the tenant and the figures');

-- _budget_verdict: a run's own token budget.
SELECT run_id AS r FROM runrow.enqueue_run(gen_random_uuid(), '"x"', 'm', token_budget => 10) \gset
UPDATE runrow.agent_run SET spent_tokens = 10 WHERE id = :'r';
SELECT is(runrow._budget_verdict((SELECT a FROM runrow.agent_run AS a WHERE a.id = :'r')),
    'budget_exhausted: the run used 10 tokens of its token_budget of 10', 'a run at its token budget');

SELECT * FROM finish();
ROLLBACK;
