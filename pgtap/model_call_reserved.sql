-- A granted model call whose holder dies mid-stream (its lease reaped) was billed by the API and
-- never settled: acquire_model_call reserves the call's worst case (the input estimate, the
-- run's max_tokens of output) and reap_expired_runs charges that reservation to the run, the
-- tenant's hour and the budgets, once. A settled call (append_step, record_usage) is charged
-- its real usage only; a hand-back by a live holder (release_run, defer_run) charges nothing;
-- the reaped holder's late settle is fenced out.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(35);
SELECT pg_temp.drain_queue();

SELECT runrow.set_model_price('priced-reserve', 3, 15, 3.75, 0.3);
SELECT runrow.set_tenant_budget('reserve-tenant', 100000, NULL);

CREATE FUNCTION pg_temp.reserve_run(
    meta jsonb DEFAULT '{"max_tokens": 1000}', tokens bigint DEFAULT NULL, attempts int DEFAULT 3
) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE run uuid;
BEGIN
    SELECT e.run_id INTO run FROM runrow.enqueue_run(
        conversation_id => gen_random_uuid(), content => '"hi"', model => 'priced-reserve',
        user_id => 'reserve-tenant', metadata => meta, token_budget => tokens, max_attempts => attempts) AS e;
    PERFORM pg_temp.claim(run);
    RETURN run;
END $$;
CREATE FUNCTION pg_temp.acquire(run uuid, estimate int DEFAULT 300) RETURNS text LANGUAGE sql AS $$
    SELECT (a.granted, a.reason)::text FROM runrow.acquire_model_call(run, pg_temp.token(run), estimate) AS a
$$;
CREATE FUNCTION pg_temp.spent(run uuid) RETURNS text LANGUAGE sql AS $$
    SELECT (spent_tokens, spent_cost::numeric(12, 6))::text FROM runrow.agent_run WHERE id = run
$$;
CREATE FUNCTION pg_temp.tenant_hour() RETURNS text LANGUAGE sql AS $$
    SELECT coalesce((SELECT (model_calls, input_tokens, output_tokens, tokens, cost::numeric(12, 6))::text
        FROM runrow.spend_hour WHERE fairness_key = 'reserve-tenant'), '(0,0,0,0,0)')
$$;
CREATE FUNCTION pg_temp.reap(run uuid) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_temp.expire(run);
    RETURN (SELECT r.outcome FROM runrow.reap_expired_runs(grace_seconds => 0) AS r WHERE r.run_id = run);
END $$;
CREATE FUNCTION pg_temp.turn(run uuid, usage jsonb) RETURNS integer LANGUAGE sql AS $$
    SELECT runrow.append_step(run, pg_temp.token(run), 'model_turn',
        json_build_array(json_build_object('type', 'text', 'text', 'ok')), NULL, usage, 'end_turn')
$$;

-- The grant reserves the call's worst case: the estimate as input, max_tokens as output.
SELECT pg_temp.reserve_run() AS k \gset
SELECT pg_temp.token(:'k') AS k_token \gset
SELECT is(pg_temp.acquire(:'k'), '(t,)', 'granted (a key without limits)');
SELECT is((SELECT (model_call_reserved, model_call_attempt)::text FROM runrow.agent_run WHERE id = :'k'),
    ('{"input_tokens": 300, "output_tokens": 1000}'::jsonb, 1)::text,
    'the reservation: the estimate as input tokens, the run''s max_tokens as output, for this attempt');
SELECT is(pg_temp.spent(:'k'), '(0,0.000000)', 'nothing is charged at the grant');

-- Its holder dies mid-stream: the reaper charges the reservation, once.
SELECT is(pg_temp.reap(:'k'), 'requeued', 'the holder''s lease is reaped');
SELECT is(pg_temp.spent(:'k'), '(1300,0.015900)',
    'the run is charged the reservation: 300 in x 3 + 1000 out x 15 per million');
SELECT is(pg_temp.tenant_hour(), '(1,300,1000,1300,0.015900)', 'and so is its tenant''s hour, as one model call');
SELECT is((SELECT model_call_reserved FROM runrow.agent_run WHERE id = :'k'), NULL, 'the reservation is spent');
-- The reaped holder's answer lands late: fenced out, it charges nothing more.
SELECT is(runrow.append_step(:'k', :'k_token', 'model_turn', '[{"type": "text", "text": "late"}]', NULL,
    '{"input_tokens": 280, "output_tokens": 900}', 'end_turn'), NULL, 'the dead holder''s append_step is fenced out');
SELECT is(runrow.record_usage(:'k', :'k_token', '{"input_tokens": 280, "output_tokens": 900}'), false,
    'and so is its record_usage');
SELECT is(pg_temp.spent(:'k'), '(1300,0.015900)', 'the call is charged exactly once');

-- The next attempt's holder dies before asking for a model call: nothing is reserved, nothing charged.
SELECT pg_temp.claim(:'k');
SELECT is(pg_temp.reap(:'k'), 'requeued', 'reaped again, before a grant');
SELECT is(pg_temp.spent(:'k'), '(1300,0.015900)', 'no reservation of this attempt: nothing charged');
SELECT runrow.cancel_run(:'k');  -- out of the claims below

-- A settled call is charged its usage, not its reservation; a reap after it charges nothing.
SELECT pg_temp.reserve_run() AS s \gset
SELECT pg_temp.acquire(:'s');
SELECT pg_temp.turn(:'s', '{"input_tokens": 50, "output_tokens": 20}');
SELECT is((SELECT (spent_tokens, model_call_reserved)::text FROM runrow.agent_run WHERE id = :'s'), '(70,)',
    'append_step charges the real usage and clears the reservation');
SELECT is(pg_temp.reap(:'s'), 'requeued', 'its holder dies after the answer');
SELECT is(pg_temp.spent(:'s'), '(70,0.000450)', 'nothing more is charged');
SELECT runrow.cancel_run(:'s');

-- A live holder hands back: release_run and defer_run charge nothing. The reservation of an
-- attempt that ended is never charged to a later one.
SELECT pg_temp.reserve_run(attempts => 5) AS h \gset
SELECT pg_temp.acquire(:'h');
SELECT runrow.release_run(:'h', pg_temp.token(:'h'), 'model API 503');
SELECT is(pg_temp.spent(:'h'), '(0,0.000000)', 'release_run charges nothing');
SELECT pg_temp.claim(:'h');
SELECT is(pg_temp.reap(:'h'), 'requeued', 'the next attempt dies before its own grant');
SELECT is(pg_temp.spent(:'h'), '(0,0.000000)', 'the earlier attempt''s reservation is not charged');
SELECT pg_temp.claim(:'h');
SELECT pg_temp.acquire(:'h');
SELECT runrow.defer_run(:'h', pg_temp.token(:'h'), interval '1 second', 'key_error: 401');
SELECT is((SELECT model_call_reserved FROM runrow.agent_run WHERE id = :'h'), NULL,
    'defer_run (the call was refused) drops the reservation');
UPDATE runrow.agent_run SET not_before = NULL WHERE id = :'h';
SELECT pg_temp.claim(:'h');
SELECT is(pg_temp.reap(:'h'), 'requeued', 'the deferred attempt''s number again, dead before a grant');
SELECT is(pg_temp.spent(:'h'), '(0,0.000000)', 'nothing charged');
SELECT runrow.cancel_run(:'h');

-- max_tokens: the run's metadata, else the agent loop's default of 4096.
SELECT pg_temp.reserve_run('{"max_tokens": "lots"}') AS d \gset
SELECT pg_temp.acquire(:'d', 10);
SELECT is((SELECT model_call_reserved FROM runrow.agent_run WHERE id = :'d'),
    '{"input_tokens": 10, "output_tokens": 4096}'::jsonb, 'no numeric max_tokens: 4096');
-- Handed back (its reservation, in flight, would hold back the tenant's next calls: 0088).
SELECT runrow.release_run(:'d', pg_temp.token(:'d'), 'done');
SELECT runrow.cancel_run(:'d');

-- The charge crosses the run's token_budget: its next request is refused, the run ends.
SELECT pg_temp.reserve_run(tokens => 1000) AS b \gset
SELECT pg_temp.acquire(:'b');
SELECT pg_temp.reap(:'b');
SELECT pg_temp.claim(:'b');
SELECT is(pg_temp.acquire(:'b'), '(f,budget_exhausted)', 'the reserved charge crossed the token_budget');
SELECT is((SELECT (status, error)::text FROM runrow.agent_run WHERE id = :'b'),
    ('failed', 'budget_exhausted: the run used 1300 tokens of its token_budget of 1000')::text,
    'the run ended for its budget, without another request');

-- The run's last attempt dies mid-call: charged before the row turns terminal (a terminal row is
-- sticky: the charge after the hand-back failed the reap, and every later pass behind it).
SELECT pg_temp.reserve_run(attempts => 1) AS f \gset
SELECT pg_temp.acquire(:'f');
SELECT pg_temp.reserve_run() AS c \gset
SELECT pg_temp.acquire(:'c');
SELECT runrow.cancel_run(:'c');
SELECT pg_temp.expire(:'f');
SELECT pg_temp.expire(:'c');
SELECT is((SELECT string_agg(r.outcome, ',' ORDER BY r.outcome) FROM runrow.reap_expired_runs(grace_seconds => 0) AS r
    WHERE r.run_id IN (:'f', :'c')), 'cancelled,failed', 'one pass reaps a run on its last attempt and a stopped one, both reserved');
SELECT is(pg_temp.spent(:'f'), '(1300,0.015900)', 'the failed run is charged its reservation');
SELECT is(pg_temp.spent(:'c'), '(1300,0.015900)', 'and so is the cancelled one');
SELECT is((SELECT count(*)::integer FROM runrow.run_event WHERE run_id IN (:'f', :'c') AND type = 'complete'), 2,
    'each ended once, journaled');

-- At most what one response can be billed, whatever max_tokens and the estimate say.
SELECT pg_temp.reserve_run('{"max_tokens": 1e300}') AS z \gset
SELECT pg_temp.acquire(:'z', 100000000);
SELECT is((SELECT model_call_reserved FROM runrow.agent_run WHERE id = :'z'),
    '{"input_tokens": 1000000, "output_tokens": 128000}'::jsonb,
    'the reservation is capped: 1,000,000 input tokens, 128,000 output tokens');
SELECT runrow.cancel_run(:'z');

-- A refused call is not billed: a 429 or a key error drops the reservation, and a holder killed
-- while it waits out the block is charged nothing.
SELECT pg_temp.reserve_run() AS q \gset
SELECT pg_temp.acquire(:'q');
SELECT runrow.report_rate_limited(:'q', pg_temp.token(:'q'), 0.001);
SELECT is((SELECT model_call_reserved FROM runrow.agent_run WHERE id = :'q'), NULL, 'a 429 drops the reservation');
SELECT is(pg_temp.reap(:'q'), 'requeued', 'its holder dies waiting out the block');
SELECT is(pg_temp.spent(:'q'), '(0,0.000000)', 'nothing is charged for the 429');
SELECT runrow.cancel_run(:'q');
DELETE FROM runrow.rate_limit WHERE rate_limit_key = 'priced-reserve';  -- the block, over (now() stands still here)
SELECT pg_temp.reserve_run() AS e \gset
SELECT pg_temp.acquire(:'e');
SELECT runrow.report_key_error(:'e', pg_temp.token(:'e'), 'invalid x-api-key', 0.001, 0.001);
SELECT is((SELECT model_call_reserved FROM runrow.agent_run WHERE id = :'e'), NULL, 'a key error drops the reservation');
SELECT is(pg_temp.reap(:'e'), 'requeued', 'its holder dies before deferring');
SELECT is(pg_temp.spent(:'e'), '(0,0.000000)', 'nothing is charged for the refused call');
SELECT runrow.cancel_run(:'e');

SELECT * FROM finish();
ROLLBACK;
