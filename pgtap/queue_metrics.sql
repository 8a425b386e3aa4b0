-- runrow.queue_metrics: the one row a metrics scrape reads, right for a known state, and
-- readable by the roles that serve /metrics (worker, client) and the auditor.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/audit.psql
SELECT plan(20);

SELECT pg_temp.drain_queue();

SELECT results_eq($$SELECT queued, running, waiting, waiting_approval, oldest_queued_age_seconds, leases_expired
                    FROM runrow.queue_metrics$$,
    $$VALUES (0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::double precision, 0::bigint)$$,
    'an idle database: every gauge 0 (no NULL age for an empty queue)');

-- One running run with a lapsed lease, one parked on an approval, two queued (the older
-- one queued 90 seconds ago).
SELECT pg_temp.running() AS lapsed \gset
SELECT pg_temp.expire(:'lapsed', 60);
SELECT pg_temp.parked() AS parked \gset
SELECT pg_temp.new_run() AS q1 \gset
SELECT pg_temp.new_run() AS q2 \gset
SELECT pg_temp.bypass(format($$UPDATE runrow.agent_run SET updated_at = now() - interval '90 seconds'
                               WHERE id = %L$$, :'q1'));

SELECT results_eq($$SELECT queued, running, waiting, waiting_approval, leases_expired FROM runrow.queue_metrics$$,
    $$VALUES (2::bigint, 1::bigint, 1::bigint, 1::bigint, 1::bigint)$$,
    'queue depth by status, runs waiting on approval, lapsed leases');
SELECT is((SELECT round(oldest_queued_age_seconds) FROM runrow.queue_metrics), 90::double precision,
    'oldest_queued_age_seconds: the longest-queued run, in seconds');
SELECT is((SELECT count(*) FROM runrow.queue_metrics), 1::bigint, 'always exactly one row');

-- The age counts only what a worker could claim now (issue 11's metrics audit): a run delayed by
-- start_in or a backoff, or a turn behind its conversation's running turn, grew older for the
-- whole wait, and the README's alert on it fired for every delayed run on an idle fleet.
SELECT run_id AS later FROM runrow.enqueue_run(gen_random_uuid(), '"later"', 'test-model', start_in => '1 hour') \gset
SELECT run_id AS due FROM runrow.enqueue_run(gen_random_uuid(), '"due"', 'test-model', start_in => '1 hour') \gset
-- (a turn a claim found behind its conversation's active turn carries claim_blocked)
SELECT pg_temp.new_run() AS behind \gset
SELECT pg_temp.bypass(format($$UPDATE runrow.agent_run SET updated_at = now() - interval '500 seconds' WHERE id = %L$$,
    :'later'));
SELECT pg_temp.bypass(format($$UPDATE runrow.agent_run SET updated_at = now() - interval '900 seconds',
    not_before = now() - interval '120 seconds' WHERE id = %L$$, :'due'));
SELECT pg_temp.bypass(format($$UPDATE runrow.agent_run SET updated_at = now() - interval '1000 seconds',
    claim_blocked = true WHERE id = %L$$, :'behind'));
SELECT results_eq($$SELECT queued, round(oldest_queued_age_seconds), queued_claimable, queued_not_due
                    FROM runrow.queue_metrics$$,
    $$VALUES (5::bigint, 120::double precision, 3::bigint, 1::bigint)$$,
    'the age is that of the run due longest (since not_before); a run not due yet and a blocked turn do not count');
SELECT results_eq($$SELECT queued_blocked, round(oldest_blocked_age_seconds) FROM runrow.queue_metrics$$,
    $$VALUES (1::bigint, 1000::double precision)$$,
    'the blocked turn is counted apart, with its own age (migration 0090)');

-- Rate-limit blocks, budgets and webhooks, each a gauge.
SELECT runrow.set_rate_limit('pgtap-key', 10, 1000, 1000);
SELECT pg_temp.bypass($$UPDATE runrow.rate_limit SET blocked_until = now() + interval '1 minute'
    WHERE rate_limit_key = 'pgtap-key'$$);
SELECT runrow.set_tenant_budget('pgtap-tenant', 10, NULL);
INSERT INTO runrow.spend_hour (fairness_key, hour, model, tokens, cost)
VALUES ('pgtap-tenant', date_trunc('hour', now()), 'test-model', 50, 0);
SELECT results_eq($$SELECT rate_limit_keys_blocked, tenants_over_budget, webhooks_pending, webhooks_dead_lettered,
                           oldest_pending_webhook_age_seconds FROM runrow.queue_metrics$$,
    $$VALUES (1::bigint, 1::bigint, 0::bigint, 0::bigint, 0::double precision)$$,
    'a blocked key and a tenant over budget are counted; no webhook, every webhook gauge 0');

-- A key whose API key or account error has not cleared counts whether or not it is blocked this
-- instant (between a block's end and its probe's hold it is not; migration 0077).
SELECT is((SELECT rate_limit_keys_key_error FROM runrow.queue_metrics), 0::bigint, 'no key error: 0');
SELECT pg_temp.bypass($$UPDATE runrow.rate_limit SET key_error = 'authentication_error: invalid x-api-key',
    key_errors = 2, key_error_since = now() - interval '1 minute', key_error_until = now() - interval '1 second',
    key_error_block = 10, blocked_until = now() - interval '1 second' WHERE rate_limit_key = 'pgtap-key'$$);
SELECT is((SELECT (rate_limit_keys_key_error, rate_limit_keys_blocked)::text FROM runrow.queue_metrics), '(1,0)',
    'a key error between blocks: counted as a key error, not as blocked');

-- Schedules (migration 0079): overdue = next tick more than 5 minutes past due; the age of the
-- oldest due tick; the schedules whose last_error is set.
DELETE FROM runrow.schedule;
SELECT is((SELECT (schedules_overdue, oldest_due_tick_age_seconds, schedules_with_last_error)::text
        FROM runrow.queue_metrics), '(0,0,0)', 'no schedule: every schedule gauge 0');
SELECT runrow.create_schedule('late', '* * * * *', '"x"', 'm') AS late \gset
SELECT runrow.create_schedule('just-due', '* * * * *', '"x"', 'm') AS just \gset
SELECT runrow.create_schedule('future', '* * * * *', '"x"', 'm') AS future \gset
SELECT runrow.create_schedule('stopped', '* * * * *', '"x"', 'm') AS stopped \gset
UPDATE runrow.schedule SET next_fire_at = now() - interval '10 minutes',
    last_error = 'tick waits for a later pass: conversation is busy' WHERE id = :'late';
UPDATE runrow.schedule SET next_fire_at = now() - interval '4 minutes' WHERE id = :'just';
UPDATE runrow.schedule SET next_fire_at = 'infinity', last_error = 'cron does not parse' WHERE id = :'stopped';
SELECT is((SELECT (schedules_overdue, round(oldest_due_tick_age_seconds), schedules_with_last_error)::text
        FROM runrow.queue_metrics), '(1,600,2)',
    'one tick 10 minutes late (4 minutes is not overdue, a future or stopped one is not due), its age, two errors');

-- Turns held behind another turn of their conversation (migration 0090): counted in none of
-- queued_claimable and queued_not_due before, so a conversation stuck behind an unanswered
-- approval or a far start_in turn showed in no gauge but the total. Real claims mark them.
SELECT pg_temp.drain_queue();
SELECT is((SELECT (queued_blocked, oldest_blocked_age_seconds)::text FROM runrow.queue_metrics), '(0,0)',
    'no queued run: queued_blocked and oldest_blocked_age_seconds 0');
SELECT gen_random_uuid() AS conv \gset
SELECT run_id AS far FROM runrow.enqueue_run(:'conv', '"in a year"', 'test-model', start_in => '366 days') \gset
SELECT run_id AS next_turn FROM runrow.enqueue_run(:'conv', '"next"', 'test-model') \gset
SELECT is((SELECT count(*) FROM runrow.claim_run(worker_id => 'pgtap')), 0::bigint,
    'a claim takes nothing: the second turn waits behind the start_in turn');
SELECT results_eq($$SELECT queued, queued_claimable, queued_not_due, queued_blocked FROM runrow.queue_metrics$$,
    $$VALUES (2::bigint, 0::bigint, 1::bigint, 1::bigint)$$,
    'behind a start_in turn: queued 2 = claimable 0 + not due 1 + blocked 1 (the audit''s case)');
-- Behind an approval nobody answered, for two days.
SELECT pg_temp.parked() AS parked2 \gset
SELECT run_id AS after_approval FROM runrow.enqueue_run(
    (SELECT conversation_id FROM runrow.agent_run WHERE id = :'parked2'), '"and then?"', 'test-model') \gset
SELECT is((SELECT count(*) FROM runrow.claim_run(worker_id => 'pgtap')), 0::bigint,
    'a claim takes nothing: the turn waits behind the approval');
SELECT pg_temp.bypass(format($$UPDATE runrow.agent_run SET updated_at = now() - interval '2 days' WHERE id = %L$$,
    :'after_approval'));
SELECT results_eq($$SELECT queued_blocked, round(oldest_blocked_age_seconds), queued,
                           queued_claimable + queued_not_due + queued_blocked FROM runrow.queue_metrics$$,
    $$VALUES (2::bigint, 172800::double precision, 3::bigint, 3::bigint)$$,
    'two blocked turns; the age is the one behind the approval for two days; the three parts add up to queued');
SELECT pg_temp.bypass(format($$UPDATE runrow.agent_run SET not_before = now() WHERE id = %L$$, :'far'));
SELECT is((SELECT (queued_not_due, queued_blocked)::text FROM runrow.queue_metrics), '(0,2)',
    'the start_in turn due: not counted as not due any more; the turn behind it is still blocked');

SELECT lives_ok($$SELECT pg_temp.as_role('runrow_worker', 'SELECT * FROM runrow.queue_metrics')$$,
    'runrow_worker reads it (runrow worker --metrics-port)');
SELECT lives_ok($$SELECT pg_temp.as_role('runrow_client', 'SELECT * FROM runrow.queue_metrics')$$,
    'runrow_client reads it (runrow serve /metrics)');
SELECT lives_ok($$SELECT pg_temp.as_role('runrow_auditor', 'SELECT * FROM runrow.queue_metrics')$$,
    'runrow_auditor reads it');

SELECT * FROM finish();
ROLLBACK;
