-- The DBA views (queue_health, run_stats, run_attempts, open_tool_effects): the right
-- numbers for a known state, documented, readable by runrow_auditor only.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/audit.psql
SELECT plan(21);

-- A known state: nothing live, nothing that ended in the last 24 hours except what this
-- test makes (older rows of other tests are pushed back two days, triggers skipped).
SELECT pg_temp.drain_queue();
SELECT pg_temp.bypass($$UPDATE runrow.agent_run SET finished_at = now() - interval '2 days'
                        WHERE finished_at > now() - interval '25 hours'$$);

SELECT results_eq($$SELECT queued, oldest_queued_age, running, waiting, leases_expiring_soon, leases_expired
                    FROM runrow.queue_health$$,
    $$VALUES (0::bigint, NULL::interval, 0::bigint, 0::bigint, 0::bigint, 0::bigint)$$,
    'queue_health of an idle database: zeros, no oldest age');

-- A completed run with `steps` text steps that ran for `took`.
CREATE FUNCTION pg_temp.completed_with(steps int, took interval) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE run uuid := pg_temp.running();
BEGIN
    FOR i IN 1 .. steps LOOP
        PERFORM runrow.append_step(run, pg_temp.token(run), 'model_turn', json_build_array(
            json_build_object('type', 'text', 'text', 'step ' || i)));
    END LOOP;
    PERFORM runrow.finish_run(run, pg_temp.token(run), 'completed');
    PERFORM pg_temp.bypass(format('UPDATE runrow.agent_run SET started_at = now() - %L::interval WHERE id = %L',
                                  took, run));
    RETURN run;
END $$;

-- Ended in the last 24 hours: four completed (1..4 steps, 1..4 minutes; the second one's
-- steps are a tool call and its result), one failed after 10 minutes, one stopped before
-- it started, one dead after two lapsed attempts.
SELECT pg_temp.completed_with(1, '1 minute') AS c1 \gset
SELECT pg_temp.running() AS c2 \gset
SELECT pg_temp.tool_turn(:'c2', 'toolu_done') AS k_done \gset
SELECT pg_temp.begin(:'c2', :'k_done', 'idempotent') AS st \gset
SELECT runrow.complete_tool_call(:'c2', pg_temp.token(:'c2'), :'k_done', '"ok"') AS step \gset
SELECT runrow.finish_run(:'c2', pg_temp.token(:'c2'), 'completed') AS fin \gset
SELECT pg_temp.bypass(format('UPDATE runrow.agent_run SET started_at = now() - interval ''2 minutes'' WHERE id = %L', :'c2'));
SELECT pg_temp.completed_with(3, '3 minutes') AS c3 \gset
SELECT pg_temp.completed_with(4, '4 minutes') AS c4 \gset
SELECT pg_temp.running() AS f1 \gset
SELECT runrow.finish_run(:'f1', pg_temp.token(:'f1'), 'failed', NULL, 'boom') AS fin \gset
SELECT pg_temp.bypass(format('UPDATE runrow.agent_run SET started_at = now() - interval ''10 minutes'' WHERE id = %L', :'f1'));
SELECT pg_temp.new_run() AS x1 \gset
SELECT runrow.cancel_run(:'x1') AS action \gset
SELECT pg_temp.exhausted(2) AS d1 \gset
-- Ended two days ago with a call executing: outside the statistics, an abandoned call.
SELECT pg_temp.running() AS a1 \gset
SELECT pg_temp.tool_turn(:'a1', 'toolu_gone') AS k_gone \gset
SELECT pg_temp.begin(:'a1', :'k_gone', 'non_idempotent') AS st \gset
SELECT runrow.finish_run(:'a1', pg_temp.token(:'a1'), 'failed') AS fin \gset
SELECT pg_temp.age_finished(:'a1', '2 days');

-- Live: running with a call in flight; running with a lease ending in 5 s; running with
-- a lease that ended an hour ago; waiting on an approval; requeued by a release with a
-- call executing (interrupted); requeued by an approval (awaiting resume); a fresh queued
-- turn that entered the queue 5 minutes ago.
SELECT pg_temp.running() AS r1 \gset
SELECT pg_temp.tool_turn(:'r1', 'toolu_fly') AS k_fly \gset
SELECT pg_temp.begin(:'r1', :'k_fly', 'non_idempotent') AS st \gset
SELECT pg_temp.bypass(format('UPDATE runrow.tool_effect SET created_at = now() - interval ''1 hour'' WHERE idempotency_key = %L', :'k_fly'));
SELECT pg_temp.running(lease => 5) AS r2 \gset
SELECT pg_temp.running() AS r3 \gset
SELECT pg_temp.expire(:'r3', 3600);
SELECT pg_temp.parked() AS w1 \gset
SELECT pg_temp.running(2) AS i1 \gset
SELECT pg_temp.tool_turn(:'i1', 'toolu_cut') AS k_cut \gset
SELECT pg_temp.begin(:'i1', :'k_cut', 'non_idempotent') AS st \gset
SELECT pg_temp.parked() AS p1 \gset
SELECT runrow.release_run(:'i1', pg_temp.token(:'i1'), 'worker draining') AS released \gset
SELECT runrow.resolve_approval(pg_temp.key_of(:'p1'), true, 'ops@example.com') AS resolved \gset
SELECT pg_temp.new_run() AS q1 \gset
SELECT pg_temp.bypass(format('UPDATE runrow.agent_run SET updated_at = now() - interval ''5 minutes'' WHERE id = %L', :'q1'));
SELECT is(:'released'::text, 'requeued', 'the released run is queued again');

-- queue_health
SELECT results_eq($$SELECT queued, oldest_queued_age, running, waiting, leases_expiring_soon, leases_expired
                    FROM runrow.queue_health$$,
    $$VALUES (3::bigint, interval '5 minutes', 3::bigint, 1::bigint, 1::bigint, 1::bigint)$$,
    'queue_health: 3 queued (oldest 5 min), 3 running, 1 waiting, 1 lease ending soon, 1 ended');
SELECT is((SELECT measured_at FROM runrow.queue_health), now(), 'measured on the database clock');

-- run_stats (percentile_cont: interpolated; rounded here only to dodge float noise)
SELECT results_eq($$SELECT status, runs, round(steps_p50::numeric, 2), round(steps_p95::numeric, 2),
                           duration_p50, duration_p95
                    FROM runrow.run_stats$$,
    $$VALUES ('queued', 3::bigint, NULL::numeric, NULL::numeric, NULL::interval, NULL::interval),
             ('running', 3, NULL, NULL, NULL, NULL),
             ('waiting', 1, NULL, NULL, NULL, NULL),
             ('completed', 4, 2.50, 3.85, interval '2 minutes 30 seconds', interval '3 minutes 51 seconds'),
             ('failed', 1, 0.00, 0.00, interval '10 minutes', interval '10 minutes'),
             ('cancelled', 1, 0.00, 0.00, NULL, NULL),
             ('dead', 1, 0.00, 0.00, interval '0', interval '0'),
             ('finished', 7, 1.00, 3.70, interval '2 minutes 30 seconds', interval '8 minutes 30 seconds')$$,
    'run_stats: live counts now; terminal counts, steps and durations of the last 24 hours');

-- run_attempts
SELECT results_eq($$SELECT status, attempt, runs FROM runrow.run_attempts$$,
    $$VALUES ('cancelled', 0, 1::bigint), ('completed', 1, 4), ('dead', 2, 1), ('failed', 1, 1),
             ('queued', 0, 2), ('queued', 1, 1), ('running', 1, 3), ('waiting', 0, 1)$$,
    'run_attempts: runs per (status, attempt), live and last 24 hours (a parked run hands its attempt back)');

-- open_tool_effects
SELECT results_eq(
    format($$SELECT run_id, state, run_status, attention, may_have_happened FROM runrow.open_tool_effects
             WHERE run_id IN (%L, %L, %L, %L, %L, %L) ORDER BY attention$$,
           :'c2', :'a1', :'r1', :'w1', :'i1', :'p1'),
    format($$VALUES (%L::uuid, 'executing', 'failed', 'abandoned', true),
                    (%L::uuid, 'needs_approval', 'waiting', 'awaiting_decision', false),
                    (%L::uuid, 'approved', 'queued', 'awaiting_resume', false),
                    (%L::uuid, 'executing', 'running', 'in_flight', true),
                    (%L::uuid, 'executing', 'queued', 'interrupted', true)$$,
           :'a1', :'w1', :'p1', :'r1', :'i1'),
    'open_tool_effects: every call without a result, what it waits for; the done call is not listed');
SELECT is((SELECT (age, state_age)::text FROM runrow.open_tool_effects WHERE idempotency_key = :'k_fly'),
    (interval '1 hour', interval '0')::text, 'age counts from the call''s record, state_age from its last change');
SELECT is((SELECT (tool, effect, args, conversation_id)::text FROM runrow.open_tool_effects WHERE run_id = :'w1'),
    (SELECT ('send_email', 'irreversible', '{"to": "a@example.com"}'::jsonb, conversation_id)::text
     FROM runrow.agent_run WHERE id = :'w1'),
    'it names the tool, the effect, the arguments and the conversation');

-- A run counts in the last 24 hours whether its journal is trimmed or not: every view reads its
-- window through agent_run_finished, and trim_journal writes no agent_run row (0061).
SELECT count(*) AS spent_before FROM runrow.spend_by_run \gset
-- trim_journal takes runs that ended before now(), the transaction's start: this one's are
-- moved an hour back, still inside the window.
SELECT pg_temp.bypass(format($$UPDATE runrow.agent_run SET finished_at = finished_at - interval '1 hour'
                               WHERE id IN (%L, %L, %L, %L, %L, %L, %L)$$,
                             :'c1', :'c2', :'c3', :'c4', :'f1', :'x1', :'d1'));
SELECT cmp_ok(runrow.trim_journal(older_than => '0'), '>', 0::bigint, 'the journals of the ended runs are trimmed');
SELECT is((SELECT count(*)::int FROM runrow.run_request
           WHERE run_id IN (:'c1', :'c2', :'c3', :'c4', :'f1', :'x1', :'d1')),
    0, 'every run that ended in the last 24 hours is now a trimmed one');
SELECT results_eq($$SELECT status, runs FROM runrow.run_stats WHERE status IN ('completed', 'finished')$$,
    $$VALUES ('completed', 4::bigint), ('finished', 7::bigint)$$,
    'run_stats still counts them');
SELECT is((SELECT count(*) FROM runrow.spend_by_run), :'spent_before'::bigint,
    'so does spend_by_run, and run_attempts:');
SELECT results_eq($$SELECT status, attempt, runs FROM runrow.run_attempts$$,
    $$VALUES ('cancelled', 0, 1::bigint), ('completed', 1, 4), ('dead', 2, 1), ('failed', 1, 1),
             ('queued', 0, 2), ('queued', 1, 1), ('running', 1, 3), ('waiting', 0, 1)$$,
    'run_attempts after the trim: the same runs');

-- Who reads them; each one documented.
SELECT ok(has_table_privilege('runrow_auditor', 'runrow.' || v, 'SELECT'), 'runrow_auditor reads ' || v)
FROM unnest(ARRAY['queue_health', 'run_stats', 'run_attempts', 'open_tool_effects']) AS v;
SELECT ok(NOT has_table_privilege('runrow_client', 'runrow.open_tool_effects', 'SELECT')
          AND NOT has_table_privilege('runrow_worker', 'runrow.queue_health', 'SELECT'),
    'client and worker roles do not (the client has pending_approvals)');
SELECT lives_ok($$SELECT pg_temp.as_role('runrow_auditor',
    'SELECT 1 FROM runrow.queue_health, runrow.run_stats, runrow.run_attempts, runrow.open_tool_effects')$$,
    'the auditor role selects from every view');
SELECT is(
    (SELECT count(*)::int FROM unnest(ARRAY['queue_health', 'run_stats', 'run_attempts', 'open_tool_effects']) AS v
     WHERE length(obj_description(('runrow.' || v)::regclass, 'pg_class')) > 100),
    4, 'every view has a COMMENT that explains it');

SELECT * FROM finish();
ROLLBACK;
