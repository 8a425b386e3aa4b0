-- runrow.audit: zero rows after a healthy workload; for each invariant, a state that breaks
-- it (written as the table owner, bypassing the functions: triggers skipped, constraints
-- and unique indexes dropped inside this rolled-back transaction) and the row naming it;
-- thresholds and the history window honoured; bad input per argument; who may call it.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/audit.psql
SELECT plan(98);
SELECT pg_temp.drain_queue();

SELECT has_function('runrow', 'audit', ARRAY['interval', 'interval', 'interval', 'interval', 'interval'],
    'audit(lease_grace, intent_age, approval_age, queued_age, history_window) exists');
SELECT ok(has_function_privilege('runrow_auditor',
    'runrow.audit(interval, interval, interval, interval, interval)', 'EXECUTE'), 'runrow_auditor may run audit()');
SELECT ok(NOT has_function_privilege('runrow_worker',
    'runrow.audit(interval, interval, interval, interval, interval)', 'EXECUTE'), 'runrow_worker may not');
SELECT ok(NOT has_function_privilege('runrow_client',
    'runrow.audit(interval, interval, interval, interval, interval)', 'EXECUTE'), 'runrow_client may not');
SELECT ok(NOT has_function_privilege('public',
    'runrow.audit(interval, interval, interval, interval, interval)', 'EXECUTE'), 'PUBLIC may not');
SELECT lives_ok($$SELECT pg_temp.as_role('runrow_auditor', 'SELECT count(*) FROM runrow.audit()')$$,
    'the auditor role runs it (SECURITY DEFINER reads tables it cannot)');

-- ---------------------------------------------------------------------------------------
-- A healthy workload through the functions only: every path a run can take.
-- ---------------------------------------------------------------------------------------
CREATE TEMP TABLE healthy (id uuid PRIMARY KEY);

-- claim, heartbeat, append, finish
SELECT pg_temp.running() AS h1 \gset
SELECT runrow.heartbeat(:'h1', pg_temp.token(:'h1'), 30) IS NOT NULL AS beat \gset
SELECT runrow.append_events(:'h1', pg_temp.token(:'h1'), '[{"type": "text_delta", "text": "hi"}]') AS appended \gset
SELECT runrow.finish_run(:'h1', pg_temp.token(:'h1'), 'completed', '{"text": "hi"}') AS fin \gset
-- lease lapses, reaped, requeued, claimed again, finished
SELECT pg_temp.running(2) AS h2 \gset
SELECT pg_temp.expire(:'h2');
SELECT count(*) AS reaped FROM runrow.reap_expired_runs() \gset
SELECT pg_temp.claim(:'h2') AS t2 \gset
SELECT runrow.finish_run(:'h2', :'t2', 'failed', NULL, 'model said no') AS fin \gset
-- reaped at most once -> failed, then a person retries it and it completes
SELECT pg_temp.running(1) AS h3 \gset
SELECT pg_temp.expire(:'h3');
SELECT count(*) AS reaped FROM runrow.reap_expired_runs() \gset
SELECT runrow.retry_run(:'h3') AS h4 \gset
SELECT pg_temp.claim(:'h4') AS t4 \gset
SELECT runrow.finish_run(:'h4', :'t4', 'completed') AS fin \gset
-- attempts exhausted by release_run -> dead
SELECT pg_temp.exhausted(2) AS h5 \gset
-- stopped while queued; cancelled while running
SELECT pg_temp.new_run() AS h6 \gset
SELECT count(*) AS stopped FROM runrow.stop_conversation((SELECT conversation_id FROM runrow.agent_run WHERE id = :'h6')) \gset
SELECT pg_temp.running() AS h7 \gset
SELECT runrow.cancel_run(:'h7') AS action \gset
SELECT runrow.finish_run(:'h7', pg_temp.token(:'h7'), 'cancelled') AS fin \gset
-- a journal trimmed whole (not a gap)
SELECT pg_temp.finished() AS h8 \gset
SELECT pg_temp.age_finished(:'h8', '2 days');
SELECT runrow.trim_journal('1 day') > 0 AS trimmed \gset
-- tools: a non_idempotent call executed and recorded, then the run completes
SELECT pg_temp.running() AS h12 \gset
SELECT pg_temp.tool_turn(:'h12', 'toolu_a') AS k12 \gset
SELECT pg_temp.begin(:'h12', :'k12', 'non_idempotent') AS s12 \gset
SELECT runrow.complete_tool_call(:'h12', pg_temp.token(:'h12'), :'k12', '"sent"') AS step \gset
SELECT runrow.append_step(:'h12', pg_temp.token(:'h12'), 'model_turn', '[{"type": "text", "text": "sent"}]') AS step \gset
SELECT runrow.finish_run(:'h12', pg_temp.token(:'h12'), 'completed') AS fin \gset
-- approval: needs_approval -> waiting -> approved -> requeued -> claimed -> approved -> done
SELECT pg_temp.running(2) AS h13 \gset
SELECT pg_temp.tool_turn(:'h13', 'toolu_b') AS k13 \gset
SELECT pg_temp.begin(:'h13', :'k13', 'irreversible') AS s13a \gset
SELECT runrow.resolve_approval(:'k13', true, 'ops@example.com') AS resolved \gset
SELECT pg_temp.claim(:'h13') AS t13 \gset
SELECT pg_temp.begin(:'h13', :'k13', 'irreversible') AS s13b \gset
SELECT runrow.complete_tool_call(:'h13', pg_temp.token(:'h13'), :'k13', '"sent"') AS step \gset
SELECT runrow.finish_run(:'h13', pg_temp.token(:'h13'), 'completed') AS fin \gset
-- rejection, reported to the model as an error
SELECT pg_temp.running(2) AS h14 \gset
SELECT pg_temp.tool_turn(:'h14', 'toolu_c') AS k14 \gset
SELECT pg_temp.begin(:'h14', :'k14', 'irreversible') AS s14a \gset
SELECT runrow.resolve_approval(:'k14', false, 'ops@example.com', 'not today') AS resolved \gset
SELECT pg_temp.claim(:'h14') AS t14 \gset
SELECT pg_temp.begin(:'h14', :'k14', 'irreversible') AS s14b \gset
SELECT runrow.complete_tool_call(:'h14', pg_temp.token(:'h14'), :'k14', '"rejected"', true) AS step \gset
SELECT runrow.finish_run(:'h14', pg_temp.token(:'h14'), 'completed') AS fin \gset
-- still waiting on a person: a fresh intent, and an uncertain call after a crash
SELECT pg_temp.parked() AS h15 \gset
SELECT pg_temp.uncertain() AS h16 \gset
SELECT is(concat_ws(',', :'s12', :'s13a', :'s13b', :'s14a', :'s14b'),
    'execute,needs_approval,approved,needs_approval,rejected', 'the tool calls took the paths intended');
-- live: a running turn with the next turn queued behind it, and a claimable queued turn
SELECT gen_random_uuid() AS hconv \gset
SELECT pg_temp.running(conv => :'hconv') AS h9 \gset
SELECT pg_temp.new_run(:'hconv') AS h10 \gset
SELECT pg_temp.new_run() AS h11 \gset
INSERT INTO healthy VALUES (:'h1'), (:'h2'), (:'h3'), (:'h4'), (:'h5'), (:'h6'), (:'h7'), (:'h8'), (:'h9'), (:'h10'),
    (:'h11'), (:'h12'), (:'h13'), (:'h14'), (:'h15'), (:'h16');

SELECT is(
    (SELECT array_agg(status ORDER BY status) FROM runrow.agent_run WHERE id IN (SELECT id FROM healthy)),
    '{cancelled,cancelled,completed,completed,completed,completed,completed,completed,dead,failed,failed,queued,queued,running,waiting,waiting}'::text[],
    'the healthy workload reached every status (the test would otherwise prove little)');
SELECT is(pg_temp.journal(:'h8'), '{}'::text[], 'h8''s journal was trimmed whole');
SELECT is_empty($$SELECT * FROM runrow.audit() WHERE run_id IN (SELECT id FROM healthy)$$,
    'a healthy workload: no violation for any of its runs');
SELECT is_empty($$SELECT * FROM runrow.audit(lease_grace => '0', intent_age => '0', approval_age => '0',
                                             queued_age => '0', history_window => '100 years')
                  WHERE run_id IN (SELECT id FROM healthy)$$,
    'nor with every threshold at zero and the whole history in scope');
SELECT is_empty($$SELECT * FROM runrow.audit() WHERE run_id IS NULL$$, 'every schema guard is in place');
-- Out of the way of the claims below (a stop is a healthy path too).
SELECT runrow.cancel_run(:'h11') AS action \gset

-- ---------------------------------------------------------------------------------------
-- schema_guard_missing
-- ---------------------------------------------------------------------------------------
ALTER TABLE runrow.message DISABLE TRIGGER message_guard;
SELECT results_eq($$SELECT invariant, detail FROM runrow.audit() WHERE run_id IS NULL$$,
    $$VALUES ('schema_guard_missing', 'trigger message_guard on runrow.message is missing, invalid or disabled')$$,
    'schema_guard_missing: a disabled trigger is named');
ALTER TABLE runrow.message ENABLE TRIGGER message_guard;
SELECT is_empty($$SELECT * FROM runrow.audit() WHERE run_id IS NULL$$, 'and disappears once re-enabled');
ALTER TABLE runrow.agent_run DISABLE TRIGGER agent_run_after_update;
SELECT results_eq($$SELECT detail FROM runrow.audit() WHERE run_id IS NULL$$,
    $$VALUES ('trigger agent_run_after_update on runrow.agent_run is missing, invalid or disabled')$$,
    'schema_guard_missing: the turn-order and unblocking statement trigger (0028) is a guard too');
ALTER TABLE runrow.agent_run ENABLE TRIGGER agent_run_after_update;
ALTER TABLE runrow.agent_run DISABLE TRIGGER agent_run_identity_guard;
SELECT results_eq($$SELECT detail FROM runrow.audit() WHERE run_id IS NULL$$,
    $$VALUES ('trigger agent_run_identity_guard on runrow.agent_run is missing, invalid or disabled')$$,
    'schema_guard_missing: the identity rule''s column-gated trigger (0044) is a guard too');
ALTER TABLE runrow.agent_run ENABLE TRIGGER agent_run_identity_guard;
ALTER TABLE runrow.run_event DISABLE TRIGGER run_event_delete_guard;
SELECT results_eq($$SELECT detail FROM runrow.audit() WHERE run_id IS NULL$$,
    $$VALUES ('trigger run_event_delete_guard on runrow.run_event is missing, invalid or disabled')$$,
    'schema_guard_missing: the journal''s delete rule (0024) is a guard too');
ALTER TABLE runrow.run_event ENABLE TRIGGER run_event_delete_guard;
DROP INDEX runrow.agent_run_idempotency_key;
SELECT results_eq($$SELECT detail FROM runrow.audit() WHERE run_id IS NULL$$,
    $$VALUES ('unique index agent_run_idempotency_key on runrow.agent_run is missing, invalid or disabled')$$,
    'schema_guard_missing: a dropped unique index is named');
-- A CHECK not validated (0106 added webhook_delivery_lapsed_token NOT VALID, 0111 validated it):
-- rows from before it may break its rule.
ALTER TABLE runrow.webhook_delivery DROP CONSTRAINT webhook_delivery_lapsed_token;
ALTER TABLE runrow.webhook_delivery ADD CONSTRAINT webhook_delivery_lapsed_token CHECK (
    lapsed_claim_token IS NULL OR (claim_token IS NULL AND state IN ('pending', 'dead'))
) NOT VALID;
SELECT results_eq($$SELECT detail FROM runrow.audit() WHERE run_id IS NULL AND detail ~ 'lapsed'$$,
    $$VALUES ('constraint webhook_delivery_lapsed_token on runrow.webhook_delivery is missing, invalid or disabled')$$,
    'schema_guard_missing: a CHECK not validated is named');
ALTER TABLE runrow.webhook_delivery VALIDATE CONSTRAINT webhook_delivery_lapsed_token;
SELECT is_empty($$SELECT * FROM runrow.audit() WHERE run_id IS NULL AND detail ~ 'lapsed'$$,
    'and is not named once validated');

-- ---------------------------------------------------------------------------------------
-- Runs: one state per invariant. The running ones come first (claims take the oldest
-- queued run, so queued breakages are set up last).
-- ---------------------------------------------------------------------------------------

-- lease_expired_unreaped, honouring lease_grace.
SELECT pg_temp.running() AS b_lease \gset
SELECT pg_temp.expire(:'b_lease', 30);
SELECT is(pg_temp.audit_of(:'b_lease'), '', 'a lease expired 30 s ago is within the default 60 s grace');
SELECT pg_temp.expire(:'b_lease', 3600);
SELECT is(pg_temp.audit_of(:'b_lease'), 'lease_expired_unreaped', 'lease_expired_unreaped: lease expired an hour ago');
SELECT matches((SELECT detail FROM runrow.audit() WHERE run_id = :'b_lease'),
    '^running on worker pgtap \(attempt 1 of 1\), lease expired 01:00:00 ago', 'the detail names the worker and the age');
SELECT is(pg_temp.audit_of(:'b_lease', lease_grace => '2 hours'), '', 'a longer lease_grace tolerates it');

-- running_without_claim
SELECT pg_temp.running() AS b_noclaim \gset
-- agent_run_state holds the row rules below: dropped once, here.
ALTER TABLE runrow.agent_run DROP CONSTRAINT agent_run_state;
UPDATE runrow.agent_run SET worker_id = NULL WHERE id = :'b_noclaim';
SELECT is(pg_temp.audit_of(:'b_noclaim'), 'running_without_claim', 'running_without_claim: no worker');
SELECT ok(EXISTS (SELECT 1 FROM runrow.audit() WHERE invariant = 'schema_guard_missing'
    AND detail LIKE 'constraint agent_run_state %'), 'the dropped CHECK constraint is named too');

-- attempt_out_of_range
SELECT pg_temp.running() AS b_attempt \gset
UPDATE runrow.agent_run SET attempt = 2 WHERE id = :'b_attempt';
SELECT is(pg_temp.audit_of(:'b_attempt'), 'attempt_out_of_range', 'attempt_out_of_range: attempt 2 of max 1');

-- live_run_has_finished_at
SELECT pg_temp.running() AS b_livefin \gset
UPDATE runrow.agent_run SET finished_at = now() WHERE id = :'b_livefin';
SELECT is(pg_temp.audit_of(:'b_livefin'), 'live_run_has_finished_at', 'live_run_has_finished_at: running with finished_at');

-- terminal_without_finished_at: found through the anomaly index, whatever the window.
SELECT pg_temp.finished() AS b_nofin \gset
SELECT pg_temp.bypass(format('UPDATE runrow.agent_run SET finished_at = NULL WHERE id = %L', :'b_nofin'));
SELECT is(pg_temp.audit_of(:'b_nofin'), 'terminal_without_finished_at', 'terminal_without_finished_at');

-- terminal_run_holds_claim: a token is found in all history (anomaly index); a lease
-- alone only within history_window (no index may cover the lease: heartbeats stay HOT).
SELECT pg_temp.finished() AS b_token \gset
SELECT pg_temp.bypass(format('UPDATE runrow.agent_run SET claim_token = gen_random_uuid() WHERE id = %L', :'b_token'));
SELECT is(pg_temp.audit_of(:'b_token'), 'terminal_run_holds_claim', 'terminal_run_holds_claim: a claim token');
-- The auditor may not read claim tokens (migration 0073): audit(), run as the owner, says one is
-- set and never prints it.
SELECT ok((SELECT d.detail LIKE '% token set,%' AND strpos(d.detail, a.claim_token::text) = 0
           FROM runrow.audit() AS d JOIN runrow.agent_run AS a ON a.id = d.run_id
           WHERE d.run_id = :'b_token' AND d.invariant = 'terminal_run_holds_claim'),
    'the detail says a claim token is set, never which');
SELECT pg_temp.age_finished(:'b_token', '1 year');
SELECT is(pg_temp.audit_of(:'b_token'), 'terminal_run_holds_claim', '... still found a year later, outside the window');
SELECT pg_temp.finished() AS b_leaseonly \gset
SELECT pg_temp.bypass(format('UPDATE runrow.agent_run SET claim_expires_at = now() WHERE id = %L', :'b_leaseonly'));
SELECT is(pg_temp.audit_of(:'b_leaseonly'), 'terminal_run_holds_claim', 'terminal_run_holds_claim: a lease');
SELECT pg_temp.age_finished(:'b_leaseonly', '30 days');
SELECT is(pg_temp.audit_of(:'b_leaseonly'), '', 'a lease alone on a run finished 30 days ago is outside the default window');
SELECT is(pg_temp.audit_of(:'b_leaseonly', history_window => '60 days'), 'terminal_run_holds_claim',
    '... and found with a 60 day history_window');

-- conversation_has_multiple_active: both runs are named.
SELECT gen_random_uuid() AS mconv \gset
SELECT pg_temp.running(conv => :'mconv') AS b_multi1 \gset
SELECT pg_temp.new_run(:'mconv') AS b_multi2 \gset
DROP INDEX runrow.agent_run_one_active_per_conversation;
UPDATE runrow.agent_run
SET status = 'running', attempt = 1, worker_id = 'rogue', claim_token = gen_random_uuid(),
    claim_expires_at = now() + interval '30 seconds'
WHERE id = :'b_multi2';
SELECT is(pg_temp.audit_of(:'b_multi1'), 'conversation_has_multiple_active', 'conversation_has_multiple_active: the first run');
SELECT is(pg_temp.audit_of(:'b_multi2'), 'conversation_has_multiple_active', '... and the second');
SELECT matches((SELECT detail FROM runrow.audit() WHERE run_id = :'b_multi2'),
    'conversation .* has 2 active runs', 'the detail counts them');

-- multiple_complete_events
SELECT pg_temp.finished() AS b_twice \gset
-- Only the seq trigger keeps a second complete out (migration 0039): written with it disabled.
ALTER TABLE runrow.run_event DISABLE TRIGGER run_event_guard;
INSERT INTO runrow.run_event (run_id, seq, type, payload)
SELECT :'b_twice', max(seq) + 1, 'complete', '{"type": "complete", "status": "failed"}'
FROM runrow.run_event WHERE run_id = :'b_twice';
ALTER TABLE runrow.run_event ENABLE TRIGGER run_event_guard;
SELECT is(pg_temp.audit_of(:'b_twice'), 'multiple_complete_events', 'multiple_complete_events');

-- complete_event_on_live_run
SELECT pg_temp.running() AS b_livecomplete \gset
INSERT INTO runrow.run_event (run_id, seq, type, payload)
SELECT :'b_livecomplete', max(seq) + 1, 'complete', '{"type": "complete", "status": "completed"}'
FROM runrow.run_event WHERE run_id = :'b_livecomplete';
SELECT is(pg_temp.audit_of(:'b_livecomplete'), 'complete_event_on_live_run', 'complete_event_on_live_run');

-- terminal_run_without_complete: the last event (the complete) deleted, no gap left.
SELECT pg_temp.finished() AS b_nocomplete \gset
DELETE FROM runrow.run_event WHERE run_id = :'b_nocomplete' AND type = 'complete';
SELECT is(pg_temp.audit_of(:'b_nocomplete'), 'terminal_run_without_complete', 'terminal_run_without_complete');

-- journal_seq_gap: a hole, a journal not starting at 1, a hole in a live journal; bounded
-- by history_window.
SELECT pg_temp.finished() AS b_hole \gset
DELETE FROM runrow.run_event WHERE run_id = :'b_hole' AND seq = 2;
SELECT is(pg_temp.audit_of(:'b_hole'), 'journal_seq_gap', 'journal_seq_gap: seq 2 missing');
SELECT is((SELECT detail FROM runrow.audit() WHERE run_id = :'b_hole'),
    'journal has 3 events numbered 1..4; expected 1..3', 'the detail says what is missing');
SELECT pg_temp.finished() AS b_head \gset
DELETE FROM runrow.run_event WHERE run_id = :'b_head' AND seq = 1;
SELECT is(pg_temp.audit_of(:'b_head'), 'journal_seq_gap', 'journal_seq_gap: a journal trimmed in part starts at 2');
SELECT pg_temp.running() AS b_livehole \gset
SELECT pg_temp.bypass(format('DELETE FROM runrow.run_event WHERE run_id = %L AND seq = 2', :'b_livehole'));
SELECT is(pg_temp.audit_of(:'b_livehole'), 'journal_seq_gap', 'journal_seq_gap: a live journal');
SELECT pg_temp.age_finished(:'b_hole', '30 days');
SELECT is(pg_temp.audit_of(:'b_hole'), '', 'a gap in a run finished 30 days ago is outside the default window');
SELECT is(pg_temp.audit_of(:'b_hole', history_window => '60 days'), 'journal_seq_gap', '... and found with a 60 day window');

-- journal_missing_result_text: a run claimed again after its first claim was lost, whose
-- new attempt's text never reached the journal (a worker dropped its buffer), written
-- through the functions alone: the journal streamed only the first attempt's partial text.
SELECT pg_temp.running(2) AS b_lost \gset
SELECT runrow.append_events(:'b_lost', pg_temp.token(:'b_lost'),
    '[{"type": "message_start"}, {"type": "text_delta", "index": 0, "text": "a long ans"}]') AS seq \gset
SELECT runrow.release_run(:'b_lost', pg_temp.token(:'b_lost'), 'lease expired') AS released \gset
SELECT pg_temp.claim(:'b_lost') AS t_lost \gset
SELECT runrow.append_events(:'b_lost', :'t_lost', '[{"type": "message_start"}]') AS seq \gset
SELECT runrow.finish_run(:'b_lost', :'t_lost', 'completed', '{"text": "a long answer"}') AS fin \gset
SELECT is(pg_temp.audit_of(:'b_lost'), 'journal_missing_result_text',
    'journal_missing_result_text: the final attempt''s answer is not in the journal');
SELECT matches((SELECT detail FROM runrow.audit() WHERE run_id = :'b_lost'),
    '^completed run''s result.text \(13 characters\) is not the end of the 10 characters of text_delta '
    'text in its journal \(last run_claimed at seq \d+\)', 'the detail gives both lengths and the last claim');
SELECT pg_temp.age_finished(:'b_lost', '30 days');
SELECT is(pg_temp.audit_of(:'b_lost'), '', 'a run finished 30 days ago is outside the default window');
SELECT is(pg_temp.audit_of(:'b_lost', history_window => '60 days'), 'journal_missing_result_text',
    '... and found with a 60 day window');
-- Trimmed whole (a delivery buffer emptied on schedule), there is nothing to judge.
SELECT pg_temp.age_finished(:'b_lost', '10 years');
SELECT is(runrow.trim_journal('5 years'), 9::bigint, 'its journal trimmed (only it ended that long ago)');
SELECT is(pg_temp.audit_of(:'b_lost', history_window => '100 years'), '', 'a trimmed journal is not reported');
-- Healthy shapes: the new attempt streamed its whole answer after a partial first one; a
-- resumed attempt that found its answer in the step log and streamed nothing more; a
-- journal with no text deltas at all.
SELECT pg_temp.running(2) AS ok_again \gset
SELECT runrow.append_events(:'ok_again', pg_temp.token(:'ok_again'),
    '[{"type": "text_delta", "index": 0, "text": "a long ans"}]') AS seq \gset
SELECT runrow.release_run(:'ok_again', pg_temp.token(:'ok_again'), 'lease expired') AS released \gset
SELECT pg_temp.claim(:'ok_again') AS t_again \gset
SELECT runrow.append_events(:'ok_again', :'t_again', '[{"type": "text_delta", "index": 0, "text": "a long "},
    {"type": "text_delta", "index": 0, "text": "answer"}]') AS seq \gset
SELECT runrow.finish_run(:'ok_again', :'t_again', 'completed', '{"text": "a long answer"}') AS fin \gset
SELECT is(pg_temp.audit_of(:'ok_again'), '', 'a re-claimed run whose last attempt streamed its answer is healthy');
SELECT pg_temp.running(2) AS ok_resumed \gset
SELECT runrow.append_events(:'ok_resumed', pg_temp.token(:'ok_resumed'),
    '[{"type": "text_delta", "index": 0, "text": "a long answer"}]') AS seq \gset
SELECT runrow.release_run(:'ok_resumed', pg_temp.token(:'ok_resumed'), 'lease expired') AS released \gset
SELECT pg_temp.claim(:'ok_resumed') AS t_resumed \gset
SELECT runrow.finish_run(:'ok_resumed', :'t_resumed', 'completed', '{"text": "a long answer"}') AS fin \gset
SELECT is(pg_temp.audit_of(:'ok_resumed'), '', 'a resumed attempt that streamed nothing after an earlier one streamed the answer is healthy');
SELECT pg_temp.finished() AS ok_nodeltas \gset
SELECT is(pg_temp.audit_of(:'ok_nodeltas'), '', 'a journal without text deltas is not judged');

-- step_seq_gap: a step deleted from the middle of the log.
SELECT pg_temp.running() AS b_steps \gset
SELECT runrow.append_step(:'b_steps', pg_temp.token(:'b_steps'), 'model_turn', '[{"type": "text", "text": "a"}]') AS step \gset
SELECT runrow.append_step(:'b_steps', pg_temp.token(:'b_steps'), 'model_turn', '[{"type": "text", "text": "b"}]') AS step \gset
SELECT runrow.append_step(:'b_steps', pg_temp.token(:'b_steps'), 'model_turn', '[{"type": "text", "text": "c"}]') AS step \gset
SELECT is(pg_temp.audit_of(:'b_steps'), '', 'three steps: no gap');
SELECT pg_temp.bypass(format('DELETE FROM runrow.agent_step WHERE run_id = %L AND seq = 2', :'b_steps'));
SELECT is(pg_temp.audit_of(:'b_steps'), 'step_seq_gap', 'step_seq_gap: step 2 missing');
SELECT is((SELECT detail FROM runrow.audit() WHERE run_id = :'b_steps'),
    'step log has 2 steps numbered 1..3; expected 1..2', 'the detail says so');

-- intent_without_result: a call executing for longer than intent_age.
SELECT pg_temp.running() AS b_intent \gset
SELECT pg_temp.tool_turn(:'b_intent', 'toolu_x') AS k_intent \gset
SELECT pg_temp.begin(:'b_intent', :'k_intent', 'non_idempotent') AS st \gset
SELECT pg_temp.bypass(format(
    'UPDATE runrow.tool_effect SET started_at = now() - interval ''1 hour'' WHERE idempotency_key = %L', :'k_intent'));
SELECT is(pg_temp.audit_of(:'b_intent'), 'intent_without_result', 'intent_without_result: executing for an hour');
SELECT matches((SELECT detail FROM runrow.audit() WHERE run_id = :'b_intent'),
    '^non_idempotent call executing of tool send_email \(key [0-9a-f]{64}\) began 01:00:00 ago \(threshold 00:10:00\)',
    'the detail names the tool, the key and the age');
SELECT is(pg_temp.audit_of(:'b_intent', intent_age => '2 hours'), '', 'a longer intent_age tolerates it');
-- Released with the call open: the next attempt begins it again, so not reported.
SELECT pg_temp.running(2) AS b_requeued \gset
SELECT pg_temp.tool_turn(:'b_requeued', 'toolu_y') AS k_requeued \gset
SELECT pg_temp.begin(:'b_requeued', :'k_requeued', 'non_idempotent') AS st \gset
SELECT runrow.release_run(:'b_requeued', pg_temp.token(:'b_requeued')) AS released \gset
SELECT pg_temp.bypass(format(
    'UPDATE runrow.tool_effect SET started_at = now() - interval ''1 hour'' WHERE idempotency_key = %L', :'k_requeued'));
SELECT is(pg_temp.audit_of(:'b_requeued'), '', 'an open call of a requeued run is not reported: the next attempt takes it up');
SELECT runrow.cancel_run(:'b_requeued') AS action \gset
SELECT is(pg_temp.audit_of(:'b_requeued'), 'intent_without_result', '... but it is once the run is stopped with it open');
SELECT runrow.finish_run(:'b_intent', pg_temp.token(:'b_intent'), 'failed') AS fin \gset
SELECT is(pg_temp.audit_of(:'b_intent'), 'intent_without_result', '... still reported once its run has ended');
SELECT pg_temp.age_finished(:'b_intent', '30 days');
SELECT is(pg_temp.audit_of(:'b_intent'), '', '... until the ending is older than history_window');
SELECT is((SELECT attention FROM runrow.open_tool_effects WHERE idempotency_key = :'k_intent'), 'abandoned',
    '... after which open_tool_effects still lists it');

-- An uncertain call of a waiting run is a person's to decide: not an intent finding, an
-- approval one once it has waited approval_age.
SELECT pg_temp.uncertain() AS b_uncertain \gset
SELECT pg_temp.bypass(format(
    'UPDATE runrow.tool_effect SET started_at = now() - interval ''1 hour'' WHERE run_id = %L', :'b_uncertain'));
SELECT is(pg_temp.audit_of(:'b_uncertain'), '', 'an uncertain call parked for a person is not an intent finding');
SELECT pg_temp.bypass(format(
    'UPDATE runrow.tool_effect SET updated_at = now() - interval ''25 hours'' WHERE run_id = %L', :'b_uncertain'));
SELECT is(pg_temp.audit_of(:'b_uncertain'), 'approval_waiting_too_long',
    'approval_waiting_too_long: an uncertain call undecided for 25 hours');

-- approval_waiting_too_long: an intent awaiting approval.
SELECT pg_temp.parked() AS b_parked \gset
SELECT pg_temp.bypass(format(
    'UPDATE runrow.tool_effect SET updated_at = now() - interval ''25 hours'' WHERE run_id = %L', :'b_parked'));
SELECT is(pg_temp.audit_of(:'b_parked'), 'approval_waiting_too_long', 'approval_waiting_too_long: needs_approval for 25 hours');
SELECT matches((SELECT detail FROM runrow.audit() WHERE run_id = :'b_parked'),
    '^needs_approval call of tool send_email \(key [0-9a-f]{64}\) has waited 1 day 01:00:00 for a decision \(threshold 24:00:00\)$',
    'the detail names the call and the wait');
SELECT is(pg_temp.audit_of(:'b_parked', approval_age => '2 days'), '', 'a longer approval_age tolerates it');

-- waiting_without_pending_approval: parked with nothing to decide.
SELECT pg_temp.running() AS b_stuck \gset
UPDATE runrow.agent_run SET status = 'waiting', claim_token = NULL, claim_expires_at = NULL WHERE id = :'b_stuck';
SELECT is(pg_temp.audit_of(:'b_stuck'), 'waiting_without_pending_approval', 'waiting_without_pending_approval');

-- queued_too_long: only a claimable turn, timed from when it became claimable.
SELECT gen_random_uuid() AS blocked_conv \gset
SELECT gen_random_uuid() AS freed_conv \gset
SELECT pg_temp.running(conv => :'blocked_conv') AS q_blocker \gset
SELECT pg_temp.running(conv => :'freed_conv') AS q_prev \gset
SELECT pg_temp.new_run(:'blocked_conv') AS q_blocked \gset
SELECT pg_temp.new_run(:'freed_conv') AS q_freed \gset
SELECT pg_temp.new_run() AS q_alone \gset
SELECT runrow.finish_run(:'q_prev', pg_temp.token(:'q_prev'), 'completed') AS fin \gset
SELECT pg_temp.bypass(format(
    'UPDATE runrow.agent_run SET updated_at = now() - interval ''1 hour'' WHERE id IN (%L, %L, %L)',
    :'q_blocked', :'q_freed', :'q_alone'));
SELECT is(pg_temp.audit_of(:'q_alone'), 'queued_too_long', 'queued_too_long: claimable and queued for an hour');
SELECT matches((SELECT detail FROM runrow.audit() WHERE run_id = :'q_alone'),
    '^claimable for 01:00:00 \(threshold 00:15:00\)', 'the detail gives the age and the threshold');
SELECT is(pg_temp.audit_of(:'q_alone', queued_age => '2 hours'), '', 'a longer queued_age tolerates it');
SELECT is(pg_temp.audit_of(:'q_blocked'), '', 'a turn behind a running turn is not reported (the blocker would be)');
SELECT is(pg_temp.audit_of(:'q_freed'), '', 'a turn whose previous turn just ended is timed from that ending');
SELECT pg_temp.age_finished(:'q_prev', '20 minutes');
SELECT is(pg_temp.audit_of(:'q_freed'), 'queued_too_long', '... and reported once that was 20 minutes ago');

-- A delayed run (start_in, a retry_in backoff, defer_run) becomes claimable at its not_before:
-- timed from then, and not reported at all before it (the SQL audit: a start_in of 2 hours was
-- queued_too_long after 2 s with queued_age 1 second, after 15 minutes by default).
SELECT (runrow.enqueue_run(gen_random_uuid(), '"later"', 'm', start_in => '2 hours')).run_id AS q_later \gset
SELECT (runrow.enqueue_run(gen_random_uuid(), '"due"', 'm', start_in => '1 hour')).run_id AS q_due \gset
SELECT pg_temp.bypass(format(
    'UPDATE runrow.agent_run SET updated_at = now() - interval ''1 hour'' WHERE id IN (%L, %L)', :'q_later', :'q_due'));
SELECT pg_temp.bypass(format(
    'UPDATE runrow.agent_run SET not_before = now() - interval ''10 minutes'' WHERE id = %L', :'q_due'));
SELECT is(pg_temp.audit_of(:'q_later', queued_age => '1 second'), '',
    'a run not due yet is not reported, however long it has been queued');
SELECT is(pg_temp.audit_of(:'q_due'), '', 'a run due 10 minutes ago has been claimable for 10 minutes, not an hour');
SELECT is(pg_temp.audit_of(:'q_due', queued_age => '5 minutes'), 'queued_too_long', '... reported past 5 minutes');
SELECT matches((SELECT detail FROM runrow.audit(queued_age => '5 minutes') WHERE run_id = :'q_due'),
    '^claimable for 00:10:00 \(threshold 00:05:00\)', '... timed from its not_before');

-- idle_run_holds_claim
SELECT pg_temp.new_run() AS b_idle \gset
UPDATE runrow.agent_run SET claim_expires_at = now() + interval '30 seconds' WHERE id = :'b_idle';
SELECT is(pg_temp.audit_of(:'b_idle'), 'idle_run_holds_claim', 'idle_run_holds_claim: a queued run with a lease');

-- The healthy runs are still clean amid all this breakage: every check is per run.
SELECT is_empty($$SELECT * FROM runrow.audit() WHERE run_id IN (SELECT id FROM healthy)$$,
    'the healthy runs are still not reported');

-- ---------------------------------------------------------------------------------------
-- Bad input: NULL -> 22004, negative -> 22023, each naming its argument.
-- ---------------------------------------------------------------------------------------
SELECT throws_ok($$SELECT * FROM runrow.audit(lease_grace => NULL)$$, '22004', 'lease_grace must not be NULL',
    'lease_grace NULL');
SELECT throws_ok($$SELECT * FROM runrow.audit(lease_grace => '-1 second')$$, '22023',
    'lease_grace must not be negative, got -00:00:01', 'lease_grace negative');
SELECT throws_ok($$SELECT * FROM runrow.audit(intent_age => NULL)$$, '22004', 'intent_age must not be NULL',
    'intent_age NULL');
SELECT throws_ok($$SELECT * FROM runrow.audit(intent_age => '-1 minute')$$, '22023',
    'intent_age must not be negative, got -00:01:00', 'intent_age negative');
SELECT throws_ok($$SELECT * FROM runrow.audit(approval_age => NULL)$$, '22004', 'approval_age must not be NULL',
    'approval_age NULL');
SELECT throws_ok($$SELECT * FROM runrow.audit(approval_age => '-1 hour')$$, '22023',
    'approval_age must not be negative, got -01:00:00', 'approval_age negative');
SELECT throws_ok($$SELECT * FROM runrow.audit(queued_age => NULL)$$, '22004', 'queued_age must not be NULL',
    'queued_age NULL');
SELECT throws_ok($$SELECT * FROM runrow.audit(queued_age => '-1 day')$$, '22023',
    'queued_age must not be negative, got -1 days', 'queued_age negative');
SELECT throws_ok($$SELECT * FROM runrow.audit(history_window => NULL)$$, '22004', 'history_window must not be NULL',
    'history_window NULL');
SELECT throws_ok($$SELECT * FROM runrow.audit(history_window => '-7 days')$$, '22023',
    'history_window must not be negative, got -7 days', 'history_window negative');
SELECT throws_ok($$SELECT * FROM runrow.audit(history_window => '-1 year 360 days')$$, '22023',
    'history_window must not be negative, got -1 years +360 days',
    'history_window that compares as 0 but is 5 days negative');
SELECT throws_ok($$SELECT * FROM runrow.audit(history_window => '1000000 years')$$, '22023',
    'history_window is out of range, got 1000000 years', 'history_window reaching before 4713 BC (was 22008)');
SELECT throws_ok($$SELECT * FROM runrow.audit(lease_grace => '10000 years')$$, '22023',
    'lease_grace is out of range, got 10000 years', 'lease_grace reaching before 4713 BC');

SELECT * FROM finish();
ROLLBACK;
