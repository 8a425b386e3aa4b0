-- runrow.begin_tool_call: the states of SPEC.md per effect class, resumed attempts,
-- parking on a person, uncertain intents, key verification, fenced out, bad input.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/row_versions.psql
\ir helpers/steps.psql
SELECT plan(72);
SELECT pg_temp.drain_queue();

\set sig '''{uuid,uuid,text,text,jsonb,text}'''
SELECT has_function('runrow', 'begin_tool_call', :sig::name[], 'begin_tool_call(run_id, claim_token, idempotency_key, tool, args, effect) exists');
SELECT is_definer('runrow', 'begin_tool_call', :sig::name[], 'begin_tool_call is SECURITY DEFINER');
SELECT function_privs_are('runrow', 'begin_tool_call', :sig::name[], 'runrow_worker', ARRAY['EXECUTE'], 'the worker may begin tool calls');
SELECT function_privs_are('runrow', 'begin_tool_call', :sig::name[], 'runrow_client', ARRAY[]::name[], 'the client may not');
SELECT function_privs_are('runrow', 'begin_tool_call', :sig::name[], 'public', ARRAY[]::name[], 'PUBLIC may not');

SELECT pg_temp.running(attempts => 3) AS r \gset

-- pure: execute, again execute, done once a result is recorded.
SELECT pg_temp.tool_turn(:'r', 'tu_1', 'search', '{"q": "x"}') AS s1 \gset
SELECT pg_temp.key(:'r', :s1, 'tu_1', 'search', '{"q": "x"}') AS k1 \gset
SELECT pg_temp.token(:'r') AS tok1 \gset
SET LOCAL ROLE runrow_worker;
SELECT is((SELECT state FROM runrow.begin_tool_call(:'r', :'tok1', :'k1', 'search', '{"q": "x"}', 'pure')), 'execute',
    'pure: execute (as the worker role)');
RESET ROLE;
SELECT is((SELECT (run_id, step_seq, tool_use_id, tool, args, effect, state, attempt, started_attempt)::text
           FROM runrow.tool_effect WHERE idempotency_key = :'k1'),
    format('(%s,1,tu_1,search,"{""q"": ""x""}",pure,executing,1,1)', :'r'),
    'the call is recorded against its run, model turn and tool_use, executing in attempt 1');
SELECT is(pg_temp.begin(:'r', pg_temp.token(:'r'), :'k1', 'search', '{"q": "x"}', 'pure'), 'execute', 'pure again before a result: execute');
SELECT runrow.complete_tool_call(:'r', pg_temp.token(:'r'), :'k1', '"hits: 3"');
SELECT results_eq(format('SELECT * FROM runrow.begin_tool_call(%L, %L, %L, ''search'', ''{"q": "x"}'', ''pure'')',
    :'r', pg_temp.token(:'r'), :'k1'), $$VALUES ('done'::text, '"hits: 3"'::jsonb)$$, 'after the result: done with it');

-- non_idempotent: a resumed attempt gets execute with the same key until a result exists.
SELECT pg_temp.tool_turn(:'r', 'tu_2', 'charge', '{"cents": 1250}') AS s2 \gset
SELECT pg_temp.key(:'r', :s2, 'tu_2', 'charge', '{"cents": 1250}') AS k2 \gset
SELECT is(pg_temp.begin(:'r', pg_temp.token(:'r'), :'k2', 'charge', '{"cents": 1250}', 'non_idempotent'), 'execute',
    'non_idempotent: execute');
SELECT pg_temp.crash_and_resume(:'r') AS tok2 \gset
SELECT is(pg_temp.begin(:'r', :'tok2', :'k2', 'charge', '{"cents": 1250}', 'non_idempotent'), 'execute',
    'the resumed attempt: execute again, with the same key');
SELECT is((SELECT (attempt, started_attempt, state)::text FROM runrow.tool_effect WHERE idempotency_key = :'k2'),
    '(1,2,executing)', 'recorded in attempt 1, begun again in attempt 2');
SELECT is(pg_temp.begin(:'r', :'tok2', :'k1', 'search', '{"q": "x"}', 'pure'), 'done',
    'the resumed attempt sees the result the first attempt recorded');
SELECT runrow.complete_tool_call(:'r', :'tok2', :'k2', '{"charge": "ch_1"}');
SELECT pg_temp.crash_and_resume(:'r') AS tok3 \gset
SELECT results_eq(format('SELECT * FROM runrow.begin_tool_call(%L, %L, %L, ''charge'', ''{"cents": 1250}'', ''non_idempotent'')',
    :'r', :'tok3', :'k2'), $$VALUES ('done'::text, '{"charge": "ch_1"}'::jsonb)$$,
    'once its result is recorded, a later attempt gets done and never charges again');

-- irreversible: an intent, then the run parks on a person.
SELECT pg_temp.tool_turn(:'r', 'tu_3', 'drop_table', '{"name": "t"}') AS s3 \gset
SELECT pg_temp.key(:'r', :s3, 'tu_3', 'drop_table', '{"name": "t"}') AS k3 \gset
SELECT is(pg_temp.begin(:'r', :'tok3', :'k3', 'drop_table', '{"name": "t"}', 'irreversible'), 'needs_approval',
    'irreversible: needs_approval');
SELECT is((SELECT (status, claim_token IS NULL, claim_expires_at IS NULL, attempt)::text FROM runrow.agent_run WHERE id = :'r'),
    '(waiting,t,t,2)', 'the run is waiting, its claim cleared and the attempt handed back');
SELECT is((SELECT owned FROM runrow.heartbeat(:'r', :'tok3')), false, 'the worker''s heartbeat says it no longer owns the run');
SELECT is(pg_temp.effect_state(:'k3'), 'needs_approval', 'the intent is recorded before anything runs');
SELECT is(pg_temp.last_event(:'r') - 'args',
    jsonb_build_object('type', 'approval_requested', 'reason', 'needs_approval', 'idempotency_key', :'k3',
        'tool', 'drop_table', 'tool_use_id', 'tu_3', 'effect', 'irreversible'),
    'approval_requested is journaled with the key, tool and call');
SELECT is((SELECT (reason, run_id, tool)::text FROM runrow.pending_approvals WHERE idempotency_key = :'k3'),
    format('(needs_approval,%s,drop_table)', :'r'), 'the call is listed in pending_approvals');
SELECT is(pg_temp.begin(:'r', :'tok3', :'k3', 'drop_table', '{"name": "t"}', 'irreversible'), 'no row',
    'the parked worker is fenced out');
SELECT is_empty('SELECT * FROM runrow.claim_run(''w'')', 'no worker can claim a waiting run');

-- Approved: requeued, claimed, approved; the start is recorded before the worker runs it.
SELECT runrow.resolve_approval(:'k3', true, 'alice');
SELECT pg_temp.claim(:'r') AS tok4 \gset
SELECT is((SELECT attempt FROM runrow.agent_run WHERE id = :'r'), 3, 'the claim after the decision counts attempt 3 again');
SELECT results_eq(format('SELECT state, result->>''decided_by'' FROM runrow.begin_tool_call(%L, %L, %L, ''drop_table'', ''{"name": "t"}'', ''irreversible'')',
    :'r', :'tok4', :'k3'), $$VALUES ('approved'::text, 'alice'::text)$$, 'approved, with the decision');
SELECT is((SELECT (state, started_attempt)::text FROM runrow.tool_effect WHERE idempotency_key = :'k3'), '(executing,3)',
    'the execution start is recorded');

-- A begin with no result after that (the worker died mid-effect, or retried): uncertain.
SELECT is(pg_temp.begin(:'r', :'tok4', :'k3', 'drop_table', '{"name": "t"}', 'irreversible'), 'uncertain',
    'begun again without a result: uncertain, never executed again');
SELECT is((SELECT status FROM runrow.agent_run WHERE id = :'r'), 'waiting', 'the run parks for a person again');
SELECT is((SELECT reason FROM runrow.pending_approvals WHERE idempotency_key = :'k3'), 'uncertain',
    'listed in pending_approvals as uncertain');
SELECT is(pg_temp.last_event(:'r') ->> 'reason', 'uncertain', 'approval_requested journaled with reason uncertain');
SELECT runrow.resolve_approval(:'k3', true, 'bob', 'checked: the table is still there');
SELECT pg_temp.claim(:'r') AS tok5 \gset
SELECT results_eq(format('SELECT state, result->>''decided_by'', result->>''note'' FROM runrow.begin_tool_call(%L, %L, %L, ''drop_table'', ''{"name": "t"}'', ''irreversible'')',
    :'r', :'tok5', :'k3'), $$VALUES ('approved'::text, 'bob'::text, 'checked: the table is still there'::text)$$,
    'a person''s yes to an uncertain call: approved, run it');
SELECT runrow.complete_tool_call(:'r', :'tok5', :'k3', '"dropped"');
SELECT is(pg_temp.begin(:'r', :'tok5', :'k3', 'drop_table', '{"name": "t"}', 'irreversible'), 'done', 'then done');

-- Rejected.
SELECT pg_temp.tool_turn(:'r', 'tu_4', 'rm', '{"path": "/"}') AS s4 \gset
SELECT pg_temp.key(:'r', :s4, 'tu_4', 'rm', '{"path": "/"}') AS k4 \gset
SELECT is(pg_temp.begin(:'r', :'tok5', :'k4', 'rm', '{"path": "/"}', 'irreversible'), 'needs_approval', 'another irreversible call');
SELECT runrow.resolve_approval(:'k4', false, 'carol', 'no');
SELECT pg_temp.claim(:'r') AS tok6 \gset
SELECT results_eq(format('SELECT state, result FROM runrow.begin_tool_call(%L, %L, %L, ''rm'', ''{"path": "/"}'', ''irreversible'')',
    :'r', :'tok6', :'k4'),
    format('VALUES (''rejected''::text, jsonb_build_object(''approved'', false, ''decided_by'', ''carol'', ''note'', ''no'', ''decided_at'', %L::timestamptz))',
        now()),
    'rejected, with who decided and why');
SELECT is(pg_temp.effect_state(:'k4'), 'rejected', 'nothing started');
SELECT is(pg_temp.begin(:'r', :'tok6', :'k4', 'rm', '{"path": "/"}', 'irreversible'), 'rejected', 'asking again: still rejected');

-- A stop requested while the worker was about to ask: no approval is asked, the run ends.
SELECT pg_temp.running() AS rs \gset
SELECT pg_temp.tool_turn(:'rs', 'tu_s', 'wipe', '{}') AS ss \gset
SELECT pg_temp.key(:'rs', :ss, 'tu_s', 'wipe', '{}') AS ks \gset
SELECT runrow.cancel_run(:'rs');
SELECT is(pg_temp.begin(:'rs', pg_temp.token(:'rs'), :'ks', 'wipe', '{}', 'irreversible'), 'needs_approval',
    'a stopped run''s irreversible call still is not executed');
SELECT is((SELECT (status, claim_token IS NULL)::text FROM runrow.agent_run WHERE id = :'rs'), '(cancelled,t)',
    'but the run ends cancelled instead of waiting for a person');
SELECT is((SELECT payload ->> 'status' FROM runrow.run_event WHERE run_id = :'rs' AND type = 'complete'), 'cancelled',
    'with its complete event');
SELECT is((SELECT count(*)::int FROM runrow.pending_approvals WHERE idempotency_key = :'ks'), 0, 'and nothing to approve');

-- A stop after a person said yes: the approved call never starts (issue 11's approvals audit: it
-- did, after the user pressed stop). The run ends cancelled; no row, so the worker stops.
SELECT pg_temp.running(2) AS ra \gset
SELECT pg_temp.tool_turn(:'ra', 'tu_a', 'wipe', '{}') AS sa \gset
SELECT pg_temp.key(:'ra', :sa, 'tu_a', 'wipe', '{}') AS ka \gset
SELECT is(pg_temp.begin(:'ra', pg_temp.token(:'ra'), :'ka', 'wipe', '{}', 'irreversible'), 'needs_approval',
    'an irreversible call asks');
SELECT runrow.resolve_approval(:'ka', true, 'alice');
SELECT pg_temp.claim(:'ra') AS toka \gset
SELECT runrow.cancel_run(:'ra');
SELECT is(pg_temp.begin(:'ra', :'toka', :'ka', 'wipe', '{}', 'irreversible'), 'no row',
    'approved, then stopped: no row, the call does not start');
SELECT is(pg_temp.effect_state(:'ka'), 'approved', 'it stays approved, never executing');
SELECT is((SELECT (status, claim_token IS NULL, error)::text FROM runrow.agent_run WHERE id = :'ra'),
    '(cancelled,t,"stopped before the approved tool call started")', 'the run ends cancelled');
SELECT is((SELECT count(*)::int FROM runrow.run_event WHERE run_id = :'ra' AND type = 'complete'), 1,
    'with one complete event');

-- A stop before a non_idempotent call starts: no intent is recorded, the run ends. A pure call
-- after a stop still runs (nothing it does needs undoing).
SELECT pg_temp.running() AS rn \gset
SELECT pg_temp.tool_turn(:'rn', 'tu_n', 'charge', '{"cents": 1}') AS sn \gset
SELECT pg_temp.key(:'rn', :sn, 'tu_n', 'charge', '{"cents": 1}') AS kn \gset
SELECT runrow.cancel_run(:'rn');
SELECT is(pg_temp.begin(:'rn', pg_temp.token(:'rn'), :'kn', 'charge', '{"cents": 1}', 'pure'), 'execute',
    'a pure call of a stopped run still executes');
SELECT pg_temp.running() AS rm \gset
SELECT pg_temp.tool_turn(:'rm', 'tu_m', 'charge', '{"cents": 1}') AS sm \gset
SELECT pg_temp.key(:'rm', :sm, 'tu_m', 'charge', '{"cents": 1}') AS km \gset
SELECT runrow.cancel_run(:'rm');
SELECT is(pg_temp.begin(:'rm', pg_temp.token(:'rm'), :'km', 'charge', '{"cents": 1}', 'non_idempotent'), 'no row',
    'a non_idempotent call of a stopped run: no row');
SELECT is((SELECT count(*)::int FROM runrow.tool_effect WHERE idempotency_key = :'km'), 0, 'no intent recorded');
SELECT is((SELECT status FROM runrow.agent_run WHERE id = :'rm'), 'cancelled', 'the run ends cancelled');

-- Key verification: the key must be tool_call_key of an unanswered tool_use of the latest turn.
-- (the model is told about the rejection first: the log needs tu_4 answered)
SELECT runrow.complete_tool_call(:'r', :'tok6', :'k4', '"rejected by carol: no"', true);
SELECT pg_temp.tool_turn(:'r', 'tu_5', 'echo', '{"a": 1}') AS s5 \gset
SELECT pg_temp.key(:'r', :s5, 'tu_5', 'echo', '{"a": 1}') AS k5 \gset
SELECT pg_temp.steps_written() AS before \gset
SELECT throws_ok(format('SELECT * FROM runrow.begin_tool_call(%L, %L, %L, ''echo'', ''{"a": 1}'', ''pure'')', :'r', :'tok6', repeat('ab', 32)),
    '22023', 'idempotency_key matches no unanswered tool_use of the run''s latest model turn with this tool and args: '
    'it must be runrow.tool_call_key(run_id, step_seq, tool_use_id, tool, args)', 'a made-up key is refused');
SELECT throws_ok(format('SELECT * FROM runrow.begin_tool_call(%L, %L, %L, ''echo'', ''{"a": 2}'', ''pure'')', :'r', :'tok6', :'k5'),
    '22023', NULL, 'the right key with other args is refused');
SELECT throws_ok(format('SELECT * FROM runrow.begin_tool_call(%L, %L, %L, ''echo'', ''{"a": 1}'', ''pure'')', :'r', :'tok6',
    pg_temp.key(:'r', :s1, 'tu_1', 'echo', '{"a": 1}')), '22023', NULL, 'a key of an earlier model turn is refused');
SELECT throws_ok(format('SELECT * FROM runrow.begin_tool_call(%L, %L, %L, ''search'', ''{"q": "x"}'', ''idempotent'')', :'r', :'tok6', :'k1'),
    '22023', 'idempotency_key was recorded for another run, tool, args or effect', 'a known key with another effect is refused');
SELECT is(pg_temp.steps_written(), :'before', 'refused keys wrote nothing');
SELECT runrow.append_step(:'r', :'tok6', 'tool_result', '{"type":"tool_result","tool_use_id":"tu_5","content":"by hand"}');
SELECT throws_ok(format('SELECT * FROM runrow.begin_tool_call(%L, %L, %L, ''echo'', ''{"a": 1}'', ''pure'')', :'r', :'tok6', :'k5'),
    '22023', NULL, 'a tool_use already answered by append_step cannot be begun');

-- Only an offered tool runs: a tool_use naming a tool the run was not enqueued with is refused
-- (a model may name any tool), and nothing is written; the worker answers it as an error.
SELECT pg_temp.tool_turn(:'r', 'tu_u', 'launch', '{"to": "moon"}') AS su \gset
SELECT pg_temp.steps_written() AS before \gset
SELECT throws_ok(format('SELECT * FROM runrow.begin_tool_call(%L, %L, %L, ''launch'', ''{"to": "moon"}'', ''pure'')',
    :'r', :'tok6', pg_temp.key(:'r', :su, 'tu_u', 'launch', '{"to": "moon"}')),
    '22023', 'tool "launch" is not among the tools the run was enqueued with: only an offered tool runs',
    'a tool the run was not offered is refused, with its right key');
SELECT is(pg_temp.steps_written(), :'before', 'the unoffered call wrote nothing');
SELECT isnt(runrow.append_step(:'r', :'tok6', 'tool_result',
    '{"type":"tool_result","tool_use_id":"tu_u","content":"Unknown tool","is_error":true}'), NULL,
    'and its tool_use is answered as an error, as the worker does');

-- A NUL in the turn's text (the escape \u0000): the tool_use is still found and begun.
SELECT pg_temp.running() AS rn \gset
SELECT pg_temp.turn(:'rn', '[{"type":"text","text":"a \u0000 b"},{"type":"tool_use","id":"tu_n","name":"echo","input":{"a":1}}]') AS sn \gset
SELECT is(pg_temp.begin(:'rn', pg_temp.token(:'rn'), pg_temp.key(:'rn', :sn, 'tu_n', 'echo', '{"a": 1}'), 'echo', '{"a": 1}', 'pure'),
    'execute', 'a tool_use of a model turn whose text holds \u0000: execute');

-- Fenced out: no row, nothing written.
SELECT pg_temp.tool_turn(:'r', 'tu_6', 'echo', '{}') AS s6 \gset
SELECT pg_temp.key(:'r', :s6, 'tu_6', 'echo', '{}') AS k6 \gset
SELECT pg_temp.steps_written() AS before \gset
SELECT is(pg_temp.begin(:'r', gen_random_uuid(), :'k6', 'echo', '{}', 'pure'), 'no row', 'a wrong token: no row');
SELECT is(pg_temp.begin(:'r', :'tok5', :'k6', 'echo', '{}', 'pure'), 'no row', 'an earlier attempt''s token: no row');
SELECT is(pg_temp.steps_written(), :'before', 'fenced-out begins wrote nothing');

-- Bad input per argument: SQLSTATE, message, nothing written.
SELECT throws_ok(format('SELECT * FROM runrow.begin_tool_call(NULL, %L, %L, ''echo'', ''{}'', ''pure'')', :'tok6', :'k6'),
    '22004', 'run_id must not be NULL', 'run_id NULL');
SELECT throws_ok(format('SELECT * FROM runrow.begin_tool_call(%L, NULL, %L, ''echo'', ''{}'', ''pure'')', :'r', :'k6'),
    '22004', 'claim_token must not be NULL', 'claim_token NULL');
SELECT throws_ok(format('SELECT * FROM runrow.begin_tool_call(%L, %L, NULL, ''echo'', ''{}'', ''pure'')', :'r', :'tok6'),
    '22004', 'idempotency_key must not be NULL', 'idempotency_key NULL');
SELECT throws_ok(format('SELECT * FROM runrow.begin_tool_call(%L, %L, ''k-1'', ''echo'', ''{}'', ''pure'')', :'r', :'tok6'),
    '22023', 'idempotency_key must be 64 lowercase hex characters, as runrow.tool_call_key returns', 'a malformed key');
SELECT throws_ok(format('SELECT * FROM runrow.begin_tool_call(%L, %L, %L, NULL, ''{}'', ''pure'')', :'r', :'tok6', :'k6'),
    '22004', 'tool must not be NULL', 'tool NULL');
SELECT throws_ok(format('SELECT * FROM runrow.begin_tool_call(%L, %L, %L, '''', ''{}'', ''pure'')', :'r', :'tok6', :'k6'),
    '22023', 'tool must be a tool name of 1 to 200 characters', 'an empty tool');
SELECT throws_ok(format('SELECT * FROM runrow.begin_tool_call(%L, %L, %L, ''echo'', NULL, ''pure'')', :'r', :'tok6', :'k6'),
    '22004', 'args must not be NULL', 'args NULL');
SELECT throws_ok(format('SELECT * FROM runrow.begin_tool_call(%L, %L, %L, ''echo'', ''[]'', ''pure'')', :'r', :'tok6', :'k6'),
    '22023', 'args must be a JSON object (the tool_use block''s input), got array', 'args not an object');
SELECT throws_ok(format('SELECT * FROM runrow.begin_tool_call(%L, %L, %L, ''echo'', ''{}'', NULL)', :'r', :'tok6', :'k6'),
    '22004', 'effect must not be NULL', 'effect NULL');
SELECT throws_ok(format('SELECT * FROM runrow.begin_tool_call(%L, %L, %L, ''echo'', ''{}'', ''risky'')', :'r', :'tok6', :'k6'),
    '22023', 'effect must be one of pure, idempotent, non_idempotent, irreversible, got "risky"', 'an unknown effect');
SELECT is(pg_temp.steps_written(), :'before', 'bad input wrote nothing');

SELECT * FROM finish();
ROLLBACK;
