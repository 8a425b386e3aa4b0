-- runrow.stop_conversation: one sweep over queued, running and waiting runs; nothing of
-- the conversation starts afterwards; repeat stops and idle conversations write nothing.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(36);
SELECT pg_temp.drain_queue();

SELECT has_function('runrow', 'stop_conversation', ARRAY['uuid'], 'stop_conversation(conversation_id) exists');

CREATE FUNCTION pg_temp.message_status(run uuid) RETURNS text LANGUAGE sql AS $$
    SELECT m.status FROM runrow.message AS m JOIN runrow.agent_run AS a ON a.user_message_id = m.id
    WHERE a.id = run
$$;

-- Conversation C: turn 1 running, turns 2 and 3 queued behind it.
\set conv '''cccccccc-0000-0000-0000-000000000001'''
SELECT pg_temp.running(conv => :conv) AS t1 \gset
SELECT pg_temp.token(:'t1') AS t1_token \gset
SELECT pg_temp.new_run(:conv) AS t2 \gset
SELECT pg_temp.new_run(:conv) AS t3 \gset

CREATE TEMP TABLE stopped AS SELECT * FROM runrow.stop_conversation(:conv);
SELECT set_eq('SELECT run_id, action FROM stopped',
    format('VALUES (%L::uuid, ''cancel_requested''), (%L::uuid, ''cancelled''), (%L::uuid, ''cancelled'')',
        :'t1', :'t2', :'t3'),
    'one row per active run: cancel_requested for the running turn, cancelled for the queued ones');

-- queued -> cancelled, message handed back as a draft, complete journaled.
SELECT is((SELECT (status, finished_at IS NOT NULL, cancel_requested, error)::text FROM runrow.agent_run WHERE id = :'t2'),
    ('cancelled', true, true, 'stopped before it finished')::text, 'a queued turn is cancelled outright');
SELECT is(pg_temp.status(:'t3'), 'cancelled', 'every queued turn is cancelled');
SELECT is(pg_temp.message_status(:'t2'), 'draft', 'the queued turn''s message is handed back as a draft');
SELECT is(pg_temp.message_status(:'t3'), 'draft', 'so is the last turn''s');
SELECT is(pg_temp.last_event(:'t2'),
    '{"type": "complete", "status": "cancelled", "result": null, "error": "stopped before it finished"}'::jsonb,
    'the queued turn journals complete cancelled');
SELECT is(pg_temp.count_events(:'t3', 'complete'), 1, 'exactly one complete per cancelled turn');

-- running -> cancel_requested; the worker still holds it and finalizes it.
SELECT is((SELECT (status, cancel_requested, claim_token)::text FROM runrow.agent_run WHERE id = :'t1'),
    ('running', true, :'t1_token'::uuid)::text, 'the running turn keeps running, cancel_requested set, claim kept');
SELECT is(pg_temp.last_event(:'t1'), '{"type": "cancel_requested"}'::jsonb, 'cancel_requested is journaled');
SELECT is(pg_temp.message_status(:'t1'), 'submitted', 'the running turn''s message is not a draft');
SELECT is((SELECT cancel_requested FROM runrow.heartbeat(:'t1', :'t1_token')), true,
    'the worker sees the stop on its next heartbeat');

-- A repeat stop: the running turn is reported again, nothing is written twice.
SELECT pg_temp.fingerprint() AS before \gset
SELECT results_eq(format('SELECT run_id, action FROM runrow.stop_conversation(%L)', :conv),
    format('VALUES (%L::uuid, ''cancel_requested'')', :'t1'), 'a second stop reports the running turn again');
SELECT is(pg_temp.fingerprint(), :'before', 'and writes nothing');
SELECT is(pg_temp.count_events(:'t1', 'cancel_requested'), 1, 'cancel_requested is journaled once');

-- The worker finalizes; afterwards nothing of the conversation is claimable.
SELECT ok(runrow.finish_run(:'t1', :'t1_token', 'cancelled', '{"text": "partial"}'), 'the worker finalizes cancelled');
SELECT is_empty('SELECT * FROM runrow.claim_run(''w'')',
    'after the stop no turn of the conversation is claimed');
SELECT is_empty(format('SELECT * FROM runrow.agent_run WHERE conversation_id = %L AND status IN (''queued'', ''running'', ''waiting'')', :conv),
    'nothing of the conversation is left active');

-- Conversation D: turn 1 parked waiting (no worker holds it), turn 2 queued.
\set convd '''dddddddd-0000-0000-0000-000000000001'''
SELECT pg_temp.running(conv => :convd) AS d1 \gset
UPDATE runrow.agent_run SET status = 'waiting', claim_token = NULL, claim_expires_at = NULL WHERE id = :'d1';
SELECT pg_temp.new_run(:convd) AS d2 \gset
SELECT set_eq(format('SELECT run_id, action FROM runrow.stop_conversation(%L)', :convd),
    format('VALUES (%L::uuid, ''cancelled''), (%L::uuid, ''cancelled'')', :'d1', :'d2'),
    'a waiting turn and the queued turn behind it are both cancelled');
SELECT is((SELECT (status, finished_at IS NOT NULL)::text FROM runrow.agent_run WHERE id = :'d1'),
    ('cancelled', true)::text, 'waiting -> cancelled, finished');
SELECT is(pg_temp.message_status(:'d1'), 'draft', 'the waiting turn''s message is handed back as a draft');
SELECT is(pg_temp.last_event(:'d1') ->> 'status', 'cancelled', 'the waiting turn journals complete cancelled');
SELECT is(pg_temp.count_events(:'d1', 'complete'), 1, 'exactly once');
SELECT is_empty('SELECT * FROM runrow.claim_run(''w'')',
    'nothing of conversation D is claimed afterwards');

-- Nothing active: no rows, nothing written.
SELECT pg_temp.fingerprint() AS before \gset
SELECT is_empty(format('SELECT * FROM runrow.stop_conversation(%L)', :convd),
    'a conversation whose runs all ended returns no rows');
SELECT is(pg_temp.fingerprint(), :'before', 'stopping an idle conversation wrote nothing');

-- An id that names no conversation is an error, as cancel_run's is (it used to return no rows,
-- so a typo or a run's id "stopped" nothing, successfully); a run's id gets a hint.
CREATE FUNCTION pg_temp.stop_error(id uuid) RETURNS text LANGUAGE plpgsql AS $$
DECLARE state text; msg text; hint text;
BEGIN
    PERFORM * FROM runrow.stop_conversation(id);
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, hint = PG_EXCEPTION_HINT;
    RETURN concat_ws(' | ', state, msg, nullif(hint, ''));
END $$;
SELECT is(pg_temp.stop_error('eeeeeeee-0000-0000-0000-000000000009'),
    'P0002 | conversation_id eeeeeeee-0000-0000-0000-000000000009 does not exist',
    'an unknown conversation raises P0002 naming conversation_id');
SELECT is(pg_temp.stop_error(:'d1'),
    format('P0002 | conversation_id %s does not exist | It is a run''s id: cancel_run stops one run.', :'d1'),
    'a run''s id raises P0002 and the hint names cancel_run');
SELECT is(pg_temp.fingerprint(), :'before', 'an unknown id wrote nothing');

-- Bad input, with an active conversation around: nothing written.
SELECT pg_temp.new_run(:conv) AS t4 \gset
SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok('SELECT * FROM runrow.stop_conversation(NULL)', '22004',
    'conversation_id must not be NULL', 'conversation_id NULL is rejected');
SELECT is(pg_temp.fingerprint(), :'before', 'bad input wrote nothing');
SELECT is(pg_temp.status(:'t4'), 'queued', 'the new turn is still queued');

-- A holder frozen inside its transaction: the wait for any lock is bounded, and the stop
-- then fails as a whole with an error naming the run and what happens next (the
-- interleaving itself, with real sessions, is in tests/test_frozen_holder.py).
SELECT ok((SELECT proconfig FROM pg_proc WHERE oid = 'runrow.stop_conversation(uuid)'::regprocedure)
    @> ARRAY['lock_timeout=5s'], 'stop_conversation waits at most lock_timeout = 5s for a lock, visible in pg_proc');
SET LOCAL lock_timeout = '5s';
SELECT throws_ok(format('SELECT runrow._stop_timed_out(%L, %L)', :conv, :'t4'), '55P03',
    format('run %s is locked by an unresponsive session (no answer within 5s): nothing was stopped', :'t4'),
    'a run lock not granted in time: 55P03 naming the run');
SELECT throws_ok(format('SELECT runrow._stop_timed_out(%L, NULL)', :conv), '55P03',
    format('conversation %s is being changed by another session that did not finish within 5s: nothing was stopped',
        :conv),
    'the conversation lock not granted in time: 55P03 naming the conversation');
RESET lock_timeout;
SELECT is(pg_temp.fingerprint(), :'before', 'and nothing was written');

SELECT * FROM finish();
ROLLBACK;
