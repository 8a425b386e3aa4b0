-- A hand-back that gives the attempt back (defer_run, a park on a person) journals `superseded`
-- for what its claim streamed after the work it committed (runrow._superseded_event): the
-- next claim has the same attempt number, and a resumed attempt 1 takes nothing back.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/steps.psql
SELECT plan(23);
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

-- Deferred again after the next claim streamed more: the walk stops at the previous
-- deferral's run_requeued (it dealt with what came before), and takes back from there.
UPDATE runrow.agent_run SET not_before = now() WHERE id = :'key';
SELECT pg_temp.claim(:'key');
SELECT pg_temp.emit(:'key', 'model_request', 'text_delta');
SELECT max(seq) AS key_last2 FROM runrow.run_event WHERE run_id = :'key' \gset
SELECT runrow.defer_run(:'key', pg_temp.token(:'key'), interval '1 second', 'key_error: x');
SELECT is(pg_temp.taken_back(:'key'),
    format('%s..%s@1 %s..%s@1', pg_temp.seq_of(:'key', 'run_claimed'), :'key_last',
        pg_temp.seq_of(:'key', 'run_requeued'), :'key_last2'),
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

-- A worker's superseded whose after_seq is not a whole number at or before its own seq is no
-- stop: defer_run raised 22P02 on 1.5, and a null one left the deltas after it in the answer.
CREATE FUNCTION pg_temp.defer_past(worker_said jsonb) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    run uuid := pg_temp.running();
    last_delta bigint;
BEGIN
    PERFORM pg_temp.emit(run, 'text_delta');
    PERFORM runrow.append_events(run, pg_temp.token(run), jsonb_build_array(worker_said));
    PERFORM pg_temp.emit(run, 'text_delta');
    last_delta := pg_temp.seq_of(run, 'text_delta', 2);
    PERFORM runrow.defer_run(run, pg_temp.token(run), interval '1 second', 'key_error: x');
    RETURN CASE WHEN pg_temp.taken_back(run) LIKE format('%% %s..%s@1', pg_temp.seq_of(run, 'run_claimed'), last_delta)
        THEN 'taken back' ELSE pg_temp.taken_back(run) END;
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END $$;
SELECT is(array_agg(pg_temp.defer_past(v) ORDER BY n),
    array_fill('taken back'::text, ARRAY[7]),
    'a superseded with a malformed after_seq neither breaks defer_run nor stops the walk: every delta '
    'since the first claim is taken back (after_seq 1.5, null, "2", -1, 1e30, none, past its own seq)')
FROM unnest(ARRAY['{"type": "superseded", "after_seq": 1.5, "through_seq": 1}', '{"type": "superseded", "after_seq": null}',
    '{"type": "superseded", "after_seq": "2"}', '{"type": "superseded", "after_seq": -1}',
    '{"type": "superseded", "after_seq": 1e30}', '{"type": "superseded"}',
    '{"type": "superseded", "after_seq": 999999}']::jsonb[]) WITH ORDINALITY AS w (v, n);
-- A whole number written as 3.0 is one.
SELECT pg_temp.running() AS whole \gset
SELECT pg_temp.emit(:'whole', 'text_delta');
SELECT pg_temp.seq_of(:'whole', 'text_delta') AS whole_delta \gset
SELECT runrow.append_events(:'whole', pg_temp.token(:'whole'),
    jsonb_build_array(jsonb_build_object('type', 'superseded', 'after_seq', (:'whole_delta' || '.0')::numeric)));
SELECT pg_temp.emit(:'whole', 'text_delta');
SELECT lives_ok(format($$SELECT runrow.defer_run(%L, %L, interval '1 second', 'key_error: x')$$, :'whole',
    pg_temp.token(:'whole')), 'defer_run past a superseded whose after_seq is N.0');
SELECT is(pg_temp.taken_back(:'whole') LIKE format('%% %s..%%', :'whole_delta'), true,
    'an after_seq of N.0 is a stop: taken back from it');
-- The same on a park (begin_tool_call raised 22P02).
SELECT pg_temp.running() AS park3 \gset
SELECT pg_temp.tool_turn(:'park3', 'tu3', 'wipe', '{}') AS pseq3 \gset
SELECT pg_temp.emit(:'park3', 'model_turn', 'text_delta');
SELECT runrow.append_events(:'park3', pg_temp.token(:'park3'), '[{"type": "superseded", "after_seq": 1.5}]');
SELECT pg_temp.emit(:'park3', 'text_delta');
SELECT lives_ok(format($$SELECT pg_temp.begin(%L, %L, %L, 'wipe', '{}', 'irreversible')$$, :'park3',
    pg_temp.token(:'park3'), pg_temp.key(:'park3', :pseq3, 'tu3', 'wipe', '{}')), 'a park past a malformed superseded');
SELECT is(pg_temp.taken_back(:'park3') LIKE format('%% %s..%%', pg_temp.seq_of(:'park3', 'model_turn')), true,
    'taken back from the committed turn');

-- A run deferred over and over before its first turn: each hand-back reads back to the
-- previous one's run_requeued, not the whole journal (it read all 3k events at the k-th).
SELECT pg_temp.running() AS often \gset
CREATE FUNCTION pg_temp.defer_again(run uuid, k int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..k LOOP
        PERFORM pg_temp.emit(run, 'model_request');
        PERFORM runrow.defer_run(run, pg_temp.token(run), interval '1 second', 'rate_limited: x');
        UPDATE runrow.agent_run SET not_before = now() WHERE id = run;
        PERFORM pg_temp.claim(run);
    END LOOP;
END $$;
SELECT pg_temp.defer_again(:'often', 30);
SELECT pg_temp.emit(:'often', 'model_request', 'text_delta');
CREATE FUNCTION pg_temp.event_rows_read() RETURNS bigint LANGUAGE sql AS $$
    SELECT idx_tup_fetch + coalesce(seq_tup_read, 0) FROM pg_stat_xact_user_tables
    WHERE relid = 'runrow.run_event'::regclass
$$;
SELECT pg_temp.event_rows_read() AS rows0 \gset
SELECT runrow.defer_run(:'often', pg_temp.token(:'often'), interval '1 second', 'rate_limited: x');
SELECT cmp_ok(pg_temp.event_rows_read() - :rows0, '<', 10::bigint,
    'the 31st deferral reads a few journal rows, not the ~90 of the run');
SELECT is(pg_temp.taken_back(:'often'),
    format('%s..%s@1', pg_temp.seq_of(:'often', 'run_requeued', 30), pg_temp.seq_of(:'often', 'text_delta')),
    'and takes back what the last claim streamed, after the previous hand-back');

SELECT * FROM finish();
ROLLBACK;
