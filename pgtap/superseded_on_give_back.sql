-- A hand-back that gives the attempt back (defer_run, a park on a person) journals `superseded`
-- for what its claim streamed after the work it committed (runrow._superseded_event): the
-- next claim has the same attempt number, and a resumed attempt 1 takes nothing back.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/steps.psql
SELECT plan(16);
SELECT pg_temp.drain_queue();

SELECT has_function('runrow', '_superseded_event', ARRAY['uuid', 'integer'], '_superseded_event exists');
SELECT isnt(obj_description('runrow._superseded_event(uuid, integer)'::regprocedure, 'pg_proc'), NULL,
    'it has a COMMENT stating its contract');

CREATE FUNCTION pg_temp.emit(run uuid, VARIADIC types text[]) RETURNS void LANGUAGE sql AS $$
    SELECT runrow.append_events(run, pg_temp.token(run),
        (SELECT jsonb_agg(jsonb_build_object('type', t, 'index', 0, 'text', 'x')) FROM unnest(types) AS t))
$$;
CREATE FUNCTION pg_temp.seq_of(run uuid, kind text, nth int DEFAULT 1) RETURNS bigint LANGUAGE sql AS $$
    SELECT seq FROM runrow.run_event WHERE run_id = run AND type = kind ORDER BY seq OFFSET nth - 1 LIMIT 1
$$;
CREATE FUNCTION pg_temp.taken_back(run uuid) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(format('%s..%s@%s', payload ->> 'after_seq', payload ->> 'through_seq',
                                      payload ->> 'attempt'), ' ' ORDER BY seq), '')
    FROM runrow.run_event WHERE run_id = run AND type = 'superseded'
$$;

-- A key error mid-stream: the claim streamed text, then was deferred with its attempt given
-- back. Taken back: (the first run_claimed, the last delta's seq], then run_requeued.
SELECT pg_temp.running() AS key \gset
SELECT pg_temp.emit(:'key', 'model_request', 'text_delta', 'text_delta');
SELECT max(seq) AS key_last FROM runrow.run_event WHERE run_id = :'key' \gset
SELECT is(runrow.defer_run(:'key', pg_temp.token(:'key'), interval '1 second', 'key_error: x'), 'deferred', 'deferred');
SELECT is(pg_temp.taken_back(:'key'), format('%s..%s@1', pg_temp.seq_of(:'key', 'run_claimed'), :'key_last'),
    'the deltas since the first claim are superseded, for the next claim (attempt 1 again)');
SELECT is((pg_temp.journal(:'key'))[array_length(pg_temp.journal(:'key'), 1) - 1 :],
    ARRAY['superseded', 'run_requeued'], 'journaled just before run_requeued');

-- Deferred again after the next claim streamed more: the walk stops at the superseded event,
-- and takes back from its after_seq (nothing was committed since) to the end.
UPDATE runrow.agent_run SET not_before = now() WHERE id = :'key';
SELECT pg_temp.claim(:'key');
SELECT pg_temp.emit(:'key', 'model_request', 'text_delta');
SELECT max(seq) AS key_last2 FROM runrow.run_event WHERE run_id = :'key' \gset
SELECT runrow.defer_run(:'key', pg_temp.token(:'key'), interval '1 second', 'key_error: x');
SELECT is(pg_temp.taken_back(:'key'),
    format('%1$s..%2$s@1 %1$s..%3$s@1', pg_temp.seq_of(:'key', 'run_claimed'), :'key_last', :'key_last2'),
    'a second deferral takes back the new deltas');
-- Deferred once more without streaming: nothing new to take back.
UPDATE runrow.agent_run SET not_before = now() WHERE id = :'key';
SELECT pg_temp.claim(:'key');
SELECT pg_temp.emit(:'key', 'model_request');
SELECT runrow.defer_run(:'key', pg_temp.token(:'key'), interval '1 second', 'rate_limited: x');
SELECT is(pg_temp.count_events(:'key', 'superseded'), 2, 'no delta since the last superseded: none more');

-- Deltas confirmed by a model_turn are kept; only those after it are taken back.
SELECT pg_temp.running() AS kept \gset
SELECT pg_temp.emit(:'kept', 'text_delta', 'model_turn', 'tool_result', 'text_delta', 'thinking_delta');
SELECT runrow.defer_run(:'kept', pg_temp.token(:'kept'), interval '1 second', 'blocked: x');
SELECT is(pg_temp.taken_back(:'kept'),
    format('%s..%s@1', pg_temp.seq_of(:'kept', 'tool_result'), pg_temp.seq_of(:'kept', 'thinking_delta')),
    'from the last committed event (tool_result) on');

-- A clean deferral (nothing streamed since the committed turn) journals none.
SELECT pg_temp.running() AS clean \gset
SELECT pg_temp.emit(:'clean', 'text_delta', 'model_turn', 'model_request');
SELECT runrow.defer_run(:'clean', pg_temp.token(:'clean'), interval '1 second', 'rate_limited: x');
SELECT is(pg_temp.count_events(:'clean', 'superseded'), 0, 'committed deltas: no superseded event');
SELECT pg_temp.running() AS none \gset
SELECT runrow.defer_run(:'none', pg_temp.token(:'none'), interval '1 second', 'rate_limited: x');
SELECT is(pg_temp.count_events(:'none', 'superseded'), 0, 'nothing streamed: no superseded event');

-- A deferral a pending stop turns into cancelled ends the run: no next claim, nothing taken back.
SELECT pg_temp.running(attempts => 2) AS stop \gset
SELECT pg_temp.emit(:'stop', 'text_delta');
SELECT runrow.cancel_run(:'stop');
SELECT is(runrow.defer_run(:'stop', pg_temp.token(:'stop'), interval '1 second', 'blocked: x'), 'cancelled',
    'a pending stop: cancelled');
SELECT is(pg_temp.count_events(:'stop', 'superseded'), 0, 'an ending journals no superseded');

-- A claim on attempt 2 (the first was requeued) deferred: the next claim is attempt 2 again.
SELECT pg_temp.running(attempts => 3) AS two \gset
SELECT runrow.release_run(:'two', pg_temp.token(:'two'), 'cut off');
SELECT pg_temp.claim(:'two');
SELECT pg_temp.emit(:'two', 'text_delta');
SELECT runrow.defer_run(:'two', pg_temp.token(:'two'), interval '1 second', 'key_error: x');
SELECT is(pg_temp.taken_back(:'two') LIKE '%@2', true, 'attempt = the next claim''s number (2 again)');

-- A park on a person: the claim after the decision is the same attempt number. A handler parks
-- with what it streamed committed (none taken back); what it streamed after is taken back.
SELECT pg_temp.running() AS park \gset
SELECT pg_temp.tool_turn(:'park', 'tu1', 'wipe', '{}') AS pseq \gset
SELECT pg_temp.emit(:'park', 'text_delta', 'model_turn', 'tool_call');
SELECT is(pg_temp.begin(:'park', pg_temp.token(:'park'), pg_temp.key(:'park', :pseq, 'tu1', 'wipe', '{}'), 'wipe',
    '{}', 'irreversible'), 'needs_approval', 'parked');
SELECT is(pg_temp.count_events(:'park', 'superseded'), 0, 'a park with its deltas committed takes nothing back');
SELECT pg_temp.running() AS park2 \gset
SELECT pg_temp.tool_turn(:'park2', 'tu2', 'wipe', '{}') AS pseq2 \gset
SELECT pg_temp.emit(:'park2', 'model_turn', 'text_delta');
SELECT pg_temp.begin(:'park2', pg_temp.token(:'park2'), pg_temp.key(:'park2', :pseq2, 'tu2', 'wipe', '{}'), 'wipe',
    '{}', 'irreversible');
SELECT is(pg_temp.taken_back(:'park2'),
    format('%s..%s@1', pg_temp.seq_of(:'park2', 'model_turn'), pg_temp.seq_of(:'park2', 'text_delta')),
    'a delta after the committed turn is taken back before approval_requested');

SELECT * FROM finish();
ROLLBACK;
