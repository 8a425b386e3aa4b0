-- runrow.interrupt_tool_call: a call the worker cut short. non_idempotent and irreversible
-- become uncertain (the next begin parks the run for a person), pure and idempotent stay
-- executing; journaled; repeatable; wrong states, fenced out, bad input.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/row_versions.psql
\ir helpers/steps.psql
SELECT plan(47);
SELECT pg_temp.drain_queue();

\set sig '''{uuid,uuid,text,text}'''
SELECT has_function('runrow', 'interrupt_tool_call', :sig::name[], 'interrupt_tool_call(run_id, claim_token, idempotency_key, reason) exists');
SELECT function_returns('runrow', 'interrupt_tool_call', :sig::name[], 'text', 'and returns text');
SELECT is_definer('runrow', 'interrupt_tool_call', :sig::name[], 'interrupt_tool_call is SECURITY DEFINER');
SELECT function_privs_are('runrow', 'interrupt_tool_call', :sig::name[], 'runrow_worker', ARRAY['EXECUTE'], 'the worker may interrupt tool calls');
SELECT function_privs_are('runrow', 'interrupt_tool_call', :sig::name[], 'runrow_client', ARRAY[]::name[], 'the client may not');
SELECT function_privs_are('runrow', 'interrupt_tool_call', :sig::name[], 'public', ARRAY[]::name[], 'PUBLIC may not');

SELECT pg_temp.running(attempts => 3) AS r \gset
SELECT pg_temp.token(:'r') AS tok \gset
-- One model turn with a call of each effect class.
SELECT pg_temp.turn(:'r', '[{"type":"tool_use","id":"tu_p","name":"search","input":{}},'
    '{"type":"tool_use","id":"tu_i","name":"set_flag","input":{}},'
    '{"type":"tool_use","id":"tu_n","name":"send_email","input":{}}]');
SELECT pg_temp.key(:'r', 1, 'tu_p', 'search', '{}') AS kp, pg_temp.key(:'r', 1, 'tu_i', 'set_flag', '{}') AS ki,
       pg_temp.key(:'r', 1, 'tu_n', 'send_email', '{}') AS kn \gset
SELECT pg_temp.begin(:'r', :'tok', :'kp', 'search', '{}', 'pure'), pg_temp.begin(:'r', :'tok', :'ki', 'set_flag', '{}', 'idempotent'),
       pg_temp.begin(:'r', :'tok', :'kn', 'send_email', '{}', 'non_idempotent');

-- non_idempotent: uncertain, journaled, as the worker role.
SELECT pg_temp.count_events(:'r', 'tool_interrupted') AS before_events \gset
SET LOCAL ROLE runrow_worker;
SELECT is(runrow.interrupt_tool_call(:'r', :'tok', :'kn', 'stopped: the run was stopped'), 'uncertain',
    'a non_idempotent call cut short is uncertain (as the worker role)');
RESET ROLE;
SELECT is(pg_temp.effect_state(:'kn'), 'uncertain', 'and recorded so');
SELECT is(pg_temp.last_event(:'r') - 'idempotency_key',
    '{"type": "tool_interrupted", "tool": "send_email", "tool_use_id": "tu_n", "effect": "non_idempotent", '
    '"state": "uncertain", "reason": "stopped: the run was stopped"}'::jsonb, 'journaled as tool_interrupted');
SELECT is(pg_temp.last_event(:'r') ->> 'idempotency_key', :'kn', 'with its key');
SELECT is(pg_temp.count_events(:'r', 'tool_interrupted'), :before_events + 1, 'one event');
SELECT throws_ok(format('SELECT runrow.complete_tool_call(%L, %L, %L, ''"sent"'')', :'r', :'tok', :'kn'), '55000', NULL,
    'an uncertain call takes no result from the worker');

-- Repeating it (its first commit unheard): the same answer, nothing written.
SELECT pg_temp.steps_written() AS before \gset
SELECT is(runrow.interrupt_tool_call(:'r', :'tok', :'kn', 'stopped'), 'uncertain', 'interrupting again: uncertain again');
SELECT is(pg_temp.steps_written(), :'before', 'and writes nothing');

-- pure and idempotent: nothing changes (running them again is safe), the cut is journaled.
SELECT is(runrow.interrupt_tool_call(:'r', :'tok', :'kp', 'stopped'), 'executing', 'a pure call stays executing');
SELECT is(pg_temp.last_event(:'r') ->> 'state', 'executing', 'journaled with its state');
SELECT is(runrow.interrupt_tool_call(:'r', :'tok', :'ki', 'drained'), 'executing', 'an idempotent call stays executing');
SELECT is(pg_temp.effect_state(:'ki'), 'executing', 'and is recorded unchanged');
SELECT throws_ok(format('UPDATE runrow.tool_effect SET state = ''uncertain'' WHERE idempotency_key = %L', :'ki'), '23000',
    format('tool_effect %s: illegal state change executing -> uncertain', :'ki'),
    'the schema keeps a safe-to-repeat call out of uncertain, whoever writes (the owner here)');
-- The worker may record the cancellation as the pure call's result.
SELECT ok(runrow.complete_tool_call(:'r', :'tok', :'kp', '"Cancelled"', true) IS NOT NULL, 'a cancelled result for the pure call');
SELECT pg_temp.steps_written() AS before \gset
SELECT is(runrow.interrupt_tool_call(:'r', :'tok', :'kp', 'stopped'), 'done', 'a call whose result landed first: done');
SELECT is(pg_temp.steps_written(), :'before', 'and nothing is written');

-- A later attempt parks on the uncertain call instead of running it again, and a person decides.
SELECT pg_temp.crash_and_resume(:'r') AS tok2 \gset
SELECT is(pg_temp.begin(:'r', :'tok2', :'kn', 'send_email', '{}', 'non_idempotent'), 'uncertain',
    'the next attempt''s begin answers uncertain');
SELECT is(pg_temp.status(:'r'), 'waiting', 'and parks the run for a person');
SELECT is((SELECT reason FROM runrow.pending_approvals WHERE idempotency_key = :'kn'), 'uncertain',
    'listed in pending_approvals as uncertain');
SELECT is((SELECT (attention, may_have_happened)::text FROM runrow.open_tool_effects WHERE idempotency_key = :'kn'),
    '(awaiting_decision,t)', 'open_tool_effects: awaiting a decision, may have happened');
SELECT runrow.resolve_approval(:'kn', true, 'alice', 'it did not go out');
SELECT pg_temp.claim(:'r') AS tok3 \gset
SELECT is(pg_temp.begin(:'r', :'tok3', :'kn', 'send_email', '{}', 'non_idempotent'), 'approved',
    'approved by a person: it runs again');

-- irreversible, approved and begun, then cut short: uncertain too.
SELECT runrow.complete_tool_call(:'r', :'tok3', :'kn', '"sent"');
SELECT runrow.complete_tool_call(:'r', :'tok3', :'ki', '"set"');
SELECT pg_temp.tool_turn(:'r', 'tu_x', 'drop_table', '{}') AS sx \gset
SELECT pg_temp.key(:'r', :sx, 'tu_x', 'drop_table', '{}') AS kx \gset
SELECT is(pg_temp.begin(:'r', :'tok3', :'kx', 'drop_table', '{}', 'irreversible'), 'needs_approval', 'an irreversible call waits');
SELECT is(runrow.interrupt_tool_call(:'r', :'tok3', :'kx', 'stopped'), NULL,
    'while it waits for a person the run holds no claim: fenced out');
SELECT runrow.resolve_approval(:'kx', true, 'bob');
SELECT pg_temp.claim(:'r') AS tok4 \gset
SELECT is(pg_temp.begin(:'r', :'tok4', :'kx', 'drop_table', '{}', 'irreversible'), 'approved', 'approved and begun');
SELECT is(runrow.interrupt_tool_call(:'r', :'tok4', :'kx', 'stopped'), 'uncertain', 'an irreversible call cut short: uncertain');

-- Wrong state: a rejected call is reported, not interrupted.
SELECT pg_temp.running() AS r2 \gset
SELECT pg_temp.tool_turn(:'r2', 'tu_w', 'wipe', '{}') AS sw \gset
SELECT pg_temp.key(:'r2', :sw, 'tu_w', 'wipe', '{}') AS kw \gset
SELECT pg_temp.begin(:'r2', pg_temp.token(:'r2'), :'kw', 'wipe', '{}', 'irreversible');
SELECT runrow.resolve_approval(:'kw', false, 'carol');
SELECT pg_temp.claim(:'r2') AS tok5 \gset
SELECT pg_temp.steps_written() AS before \gset
SELECT throws_ok(format('SELECT runrow.interrupt_tool_call(%L, %L, %L, ''stopped'')', :'r2', :'tok5', :'kw'), '55000',
    'idempotency_key is rejected: only a call begin_tool_call said to execute (or approved) can be interrupted',
    'a call in another state is refused');
SELECT throws_ok(format('SELECT runrow.interrupt_tool_call(%L, %L, %L, ''stopped'')', :'r2', :'tok5', :'kx'), '22023',
    'idempotency_key is not a tool call of this run: call begin_tool_call first', 'a key of another run');
SELECT throws_ok(format('SELECT runrow.interrupt_tool_call(%L, %L, %L, ''stopped'')', :'r2', :'tok5', repeat('a', 64)), '22023',
    'idempotency_key is not a tool call of this run: call begin_tool_call first', 'a key never begun');
SELECT is(pg_temp.steps_written(), :'before', 'refused interrupts wrote nothing');

-- Fenced out: a wrong token, a run that ended.
SELECT pg_temp.running() AS r3 \gset
SELECT pg_temp.token(:'r3') AS tok6 \gset
SELECT pg_temp.tool_turn(:'r3', 'tu_f', 'f', '{}') AS sf \gset
SELECT pg_temp.key(:'r3', :sf, 'tu_f', 'f', '{}') AS kf \gset
SELECT pg_temp.begin(:'r3', :'tok6', :'kf', 'f', '{}', 'non_idempotent');
SELECT pg_temp.steps_written() AS before \gset
SELECT is(runrow.interrupt_tool_call(:'r3', gen_random_uuid(), :'kf', 'stopped'), NULL, 'a wrong token: NULL');
SELECT is(pg_temp.steps_written(), :'before', 'and nothing written');
SELECT runrow.finish_run(:'r3', :'tok6', 'cancelled');
SELECT pg_temp.steps_written() AS before2 \gset
SELECT is(runrow.interrupt_tool_call(:'r3', :'tok6', :'kf', 'stopped'), NULL, 'a finished run: NULL');
SELECT is(pg_temp.effect_state(:'kf'), 'executing', 'the call is left as it was');
SELECT is(pg_temp.steps_written(), :'before2', 'fenced-out interrupts wrote nothing');

-- Bad input.
SELECT pg_temp.steps_written() AS before \gset
SELECT throws_ok(format('SELECT runrow.interrupt_tool_call(NULL, %L, %L, ''x'')', :'tok5', :'kw'), '22004', 'run_id must not be NULL', 'run_id NULL');
SELECT throws_ok(format('SELECT runrow.interrupt_tool_call(%L, NULL, %L, ''x'')', :'r2', :'kw'), '22004', 'claim_token must not be NULL', 'claim_token NULL');
SELECT throws_ok(format('SELECT runrow.interrupt_tool_call(%L, %L, NULL, ''x'')', :'r2', :'tok5'), '22004', 'idempotency_key must not be NULL', 'idempotency_key NULL');
SELECT throws_ok(format('SELECT runrow.interrupt_tool_call(%L, %L, ''ABC'', ''x'')', :'r2', :'tok5'), '22023',
    'idempotency_key must be 64 lowercase hex characters, as runrow.tool_call_key returns', 'a malformed key');
SELECT throws_ok(format('SELECT runrow.interrupt_tool_call(%L, %L, %L, NULL)', :'r2', :'tok5', :'kw'), '22004', 'reason must not be NULL', 'reason NULL');
SELECT throws_ok(format('SELECT runrow.interrupt_tool_call(%L, %L, %L, %L)', :'r2', :'tok5', :'kw', repeat('x', 1001)), '22023',
    'reason must say why the call was cut short in 1 to 1000 characters', 'an over-long reason');
SELECT is(pg_temp.steps_written(), :'before', 'bad input wrote nothing');

SELECT * FROM finish();
ROLLBACK;
