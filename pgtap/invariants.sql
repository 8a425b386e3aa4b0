-- The invariants that live in the schema (SPEC.md "Invariants"), proven by writing the
-- tables directly, around the functions: as the superuser running the test and, where
-- the claim is "even the owner", as the table owner.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(87);
SELECT pg_temp.drain_queue();
SELECT pg_temp.owner() AS owner \gset

-- ---------------------------------------------------------------------------------
-- 2. Terminal states are sticky, even for the owner.
-- ---------------------------------------------------------------------------------
SELECT pg_temp.finished('completed') AS completed \gset
SELECT pg_temp.finished('failed') AS failed \gset
SELECT pg_temp.finished('cancelled') AS cancelled \gset
SELECT pg_temp.exhausted(2) AS dead \gset
SELECT isnt(:'owner'::name, NULL, 'the runrow tables have an owner to test with');
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        format($$UPDATE runrow.agent_run SET status = 'queued', finished_at = NULL WHERE id = %L$$, :'completed')),
    '23000', format('run %s is completed and terminal states are sticky', :'completed'),
    'the owner cannot move a completed run back to queued');
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        format($$UPDATE runrow.agent_run SET status = 'completed' WHERE id = %L$$, :'failed')),
    '23000', format('run %s is failed and terminal states are sticky', :'failed'),
    'the owner cannot turn a failed run into a completed one');
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        format($$UPDATE runrow.agent_run SET result = '{}' WHERE id = %L$$, :'cancelled')),
    '23000', format('run %s is cancelled and terminal states are sticky', :'cancelled'),
    'the owner cannot edit a cancelled run''s result');
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        format($$UPDATE runrow.agent_run SET attempt = 0, error = NULL WHERE id = %L$$, :'dead')),
    '23000', format('run %s is dead and terminal states are sticky', :'dead'),
    'the owner cannot revive a dead run');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET finished_at = now() - interval '1 day' WHERE id = %L$$, :'completed'),
    '23000', NULL, 'nor can the superuser through the trigger');
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        format($$UPDATE runrow.agent_run SET updated_at = now() - interval '1 day', metadata = '{"x": 1}'
                 WHERE id = %L$$, :'completed')),
    '23000', format('run %s is completed and terminal states are sticky', :'completed'),
    'no change at all on a terminal run (the request snapshot that trim_journal drops is run_request''s since 0061)');
SELECT lives_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        format($$UPDATE runrow.agent_run SET updated_at = now() - interval '1 day' WHERE id = %L$$, :'completed')),
    'a write that changes nothing but updated_at is not a change');

-- ---------------------------------------------------------------------------------
-- The lifecycle: illegal status changes and identity changes.
-- ---------------------------------------------------------------------------------
SELECT pg_temp.new_run() AS queued \gset
SELECT throws_ok(format($$UPDATE runrow.agent_run SET status = 'completed', finished_at = now() WHERE id = %L$$, :'queued'),
    '23000', format('run %s: illegal status change queued -> completed', :'queued'), 'queued -> completed is illegal');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET status = 'dead', finished_at = now() WHERE id = %L$$, :'queued'),
    '23000', format('run %s: illegal status change queued -> dead', :'queued'), 'queued -> dead is illegal');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET status = 'waiting' WHERE id = %L$$, :'queued'),
    '23000', format('run %s: illegal status change queued -> waiting', :'queued'), 'queued -> waiting is illegal');
-- Into another conversation that exists: the guard, not the conversation's foreign key, refuses
-- it (both are AFTER triggers since 0030, and the key's fires first on a conversation nobody has).
SELECT throws_ok(format($$UPDATE runrow.agent_run SET conversation_id = (
        SELECT c.conversation_id FROM runrow.agent_run AS c WHERE c.id = %L) WHERE id = %L$$, :'completed', :'queued'),
    '23000', format('run %s: id, conversation, message, model, prompt and created_at are immutable', :'queued'),
    'a run cannot move to another conversation');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET model = 'other' WHERE id = %L$$, :'queued'),
    '23000', NULL, 'a run''s pinned model cannot change');
-- Checked once per statement since 0042: a changed id shows as an old row without its new one;
-- an identity change beside a status move is reported as the identity change (the row guard's
-- order); one bad row among good ones fails the whole statement.
SELECT throws_ok(format($$UPDATE runrow.agent_run SET id = gen_random_uuid() WHERE id = %L$$, :'queued'),
    '23000', format('run %s: id, conversation, message, model, prompt and created_at are immutable', :'queued'),
    'a run''s id cannot change');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET model = 'other', status = 'completed', finished_at = now()
        WHERE id = %L$$, :'queued'),
    '23000', format('run %s: id, conversation, message, model, prompt and created_at are immutable', :'queued'),
    'an identity change beside an illegal status move is reported as the identity change');
-- Since 0044 identity is a row trigger gated on the identity columns (agent_run_identity_guard):
-- it fires only where a statement assigns one, refuses only a real change, for the owner too,
-- and reports a terminal run's identity change as sticky, as the rules' order has it.
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        format($$UPDATE runrow.agent_run SET created_at = created_at - interval '1 day' WHERE id = %L$$, :'queued')),
    '23000', format('run %s: id, conversation, message, model, prompt and created_at are immutable', :'queued'),
    'the owner cannot backdate a run either');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET model = 'other' WHERE id = %L$$, :'completed'),
    '23000', format('run %s is completed and terminal states are sticky', :'completed'),
    'a terminal run''s identity change is reported as sticky');
SELECT lives_ok(format($$UPDATE runrow.agent_run SET model = model, conversation_id = conversation_id,
        updated_at = now() WHERE id = %L$$, :'queued'),
    'an identity column assigned its own value is no change, and is allowed');
SELECT pg_temp.new_run() AS fine \gset
SELECT throws_ok(format($$UPDATE runrow.agent_run SET status = CASE WHEN id = %L THEN 'completed' ELSE status END,
        finished_at = CASE WHEN id = %L THEN now() END, updated_at = now() WHERE id IN (%L, %L)$$,
        :'queued', :'queued', :'queued', :'fine'),
    '23000', format('run %s: illegal status change queued -> completed', :'queued'),
    'one illegal move among legal writes fails the whole statement');
SELECT is((SELECT count(*) FROM runrow.agent_run WHERE id IN (:'queued', :'fine') AND status = 'queued'), 2::bigint,
    'and both runs are as they were');
SELECT pg_temp.claim(:'queued');
UPDATE runrow.agent_run SET status = 'waiting', claim_token = NULL, claim_expires_at = NULL WHERE id = :'queued';
SELECT throws_ok(format($$UPDATE runrow.agent_run SET status = 'running', claim_token = gen_random_uuid(),
        claim_expires_at = now() + interval '1 minute' WHERE id = %L$$, :'queued'),
    '23000', format('run %s: illegal status change waiting -> running', :'queued'),
    'waiting -> running is illegal (a decision requeues it)');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET status = 'completed', finished_at = now() WHERE id = %L$$, :'queued'),
    '23000', format('run %s: illegal status change waiting -> completed', :'queued'), 'waiting -> completed is illegal');

-- Turn order: the second turn cannot start while the first is queued, even written directly.
SELECT pg_temp.drain_queue();
\set conv '''eeeeeeee-0000-0000-0000-000000000001'''
SELECT pg_temp.new_run(:conv) AS turn1 \gset
SELECT pg_temp.new_run(:conv) AS turn2 \gset
SELECT throws_ok(format($$UPDATE runrow.agent_run SET status = 'running', attempt = 1, worker_id = 'w',
        claim_token = gen_random_uuid(), claim_expires_at = now() + interval '1 minute' WHERE id = %L$$, :'turn2'),
    '40001', format('run %s: an earlier turn of conversation %s is still queued', :'turn2', :conv),
    'a later turn cannot start before an earlier queued one');
-- The guard's WHEN clause (0026) skips only legal moves whose writer stamped updated_at itself,
-- as the claim and finish_runs do: a stamped write is still refused whenever the rules say so.
SELECT throws_ok(format($$UPDATE runrow.agent_run SET status = 'completed', finished_at = now(), updated_at = now()
        WHERE id = %L$$, :'turn2'),
    '23000', format('run %s: illegal status change queued -> completed', :'turn2'),
    'an illegal status change is refused even when the writer stamps updated_at');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET model = 'other', updated_at = now() WHERE id = %L$$, :'turn2'),
    '23000', format('run %s: id, conversation, message, model, prompt and created_at are immutable', :'turn2'),
    'an identity change is refused even when the writer stamps updated_at');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET result = '{}', updated_at = now() WHERE id = %L$$, :'completed'),
    '23000', format('run %s is completed and terminal states are sticky', :'completed'),
    'a terminal run stays sticky even when the writer stamps updated_at');
-- Turn order is checked once per statement (agent_run_after_update): a statement that starts a
-- later turn beside a run that may start fails as a whole.
SELECT pg_temp.new_run() AS free_run \gset
SELECT throws_ok(format($$UPDATE runrow.agent_run SET status = 'running', attempt = 1, worker_id = 'w',
        claim_token = gen_random_uuid(), claim_expires_at = now() + interval '1 minute', updated_at = now()
        WHERE id IN (%L, %L)$$, :'free_run', :'turn2'),
    '40001', format('run %s: an earlier turn of conversation %s is still queued', :'turn2', :conv),
    'a statement starting a later turn beside another run is refused');
SELECT is((SELECT array_agg(status ORDER BY enqueue_seq) FROM runrow.agent_run WHERE id IN (:'free_run', :'turn2')),
    ARRAY['queued', 'queued'], 'and starts neither run');
SELECT runrow.cancel_run(:'free_run');

-- ---------------------------------------------------------------------------------
-- 1. At most one running or waiting run per conversation, even written directly.
-- ---------------------------------------------------------------------------------
SELECT pg_temp.claim(:'turn1');
SELECT pg_temp.new_run(:conv) AS turn3 \gset
SELECT runrow.cancel_run(:'turn2');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET status = 'running', attempt = 1, worker_id = 'w',
        claim_token = gen_random_uuid(), claim_expires_at = now() + interval '1 minute' WHERE id = %L$$, :'turn3'),
    '23505', 'duplicate key value violates unique constraint "agent_run_one_active_per_conversation"',
    'two running runs in one conversation are rejected by the unique index');
SELECT throws_ok(format($$INSERT INTO runrow.agent_run (conversation_id, user_message_id, model, prompt_id,
        status, attempt, worker_id, claim_token, claim_expires_at)
        SELECT conversation_id, user_message_id, model, prompt_id, 'running', 1, 'w', gen_random_uuid(),
               now() + interval '1 minute' FROM runrow.agent_run WHERE id = %L$$, :'turn3'),
    '23505', 'duplicate key value violates unique constraint "agent_run_one_active_per_conversation"',
    'a running run inserted directly next to a running one is rejected');
UPDATE runrow.agent_run SET status = 'waiting', claim_token = NULL, claim_expires_at = NULL WHERE id = :'turn1';
SELECT throws_ok(format($$UPDATE runrow.agent_run SET status = 'running', attempt = 1, worker_id = 'w',
        claim_token = gen_random_uuid(), claim_expires_at = now() + interval '1 minute' WHERE id = %L$$, :'turn3'),
    '23505', 'duplicate key value violates unique constraint "agent_run_one_active_per_conversation"',
    'running next to a waiting run in one conversation is rejected');

-- ---------------------------------------------------------------------------------
-- 3. A running run holds a claim; any other status holds none.
-- ---------------------------------------------------------------------------------
SELECT pg_temp.drain_queue();
SELECT pg_temp.new_run() AS bare \gset
SELECT throws_ok(format($$UPDATE runrow.agent_run SET status = 'running', attempt = 1, worker_id = 'w',
        claim_expires_at = now() + interval '1 minute' WHERE id = %L$$, :'bare'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_claim_iff_running"',
    'running without a token is rejected');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET status = 'running', attempt = 1,
        claim_token = gen_random_uuid() WHERE id = %L$$, :'bare'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_claim_iff_running"',
    'running without a lease is rejected');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET claim_token = gen_random_uuid() WHERE id = %L$$, :'bare'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_no_claim_unless_running"',
    'a queued run with a token is rejected');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET claim_expires_at = now() WHERE id = %L$$, :'bare'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_no_claim_unless_running"',
    'a queued run with a lease is rejected');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET status = 'running', attempt = 0, worker_id = 'w',
        claim_token = gen_random_uuid(), claim_expires_at = now() + interval '1 minute' WHERE id = %L$$, :'bare'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_running_has_attempt"',
    'running at attempt 0 is rejected');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET attempt = 2 WHERE id = %L$$, :'bare'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_attempt_range"',
    'attempt beyond max_attempts is rejected');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET finished_at = now() WHERE id = %L$$, :'bare'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_finished_iff_terminal"',
    'a queued run with finished_at is rejected');
SELECT throws_ok(format($$UPDATE runrow.agent_run SET status = 'paused' WHERE id = %L$$, :'bare'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_status_check"',
    'an unknown status is rejected');
-- Two rules broken at once: the first by name is reported, as PostgreSQL orders CHECKs.
SELECT throws_ok(format($$UPDATE runrow.agent_run SET attempt = 2, finished_at = now() WHERE id = %L$$, :'bare'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_attempt_range"',
    'of two broken rules the first by name is reported');
-- The error carries the rule's name in its constraint field, as a failed CHECK does.
CREATE FUNCTION pg_temp.broken_constraint(stmt text) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    name text;
BEGIN
    EXECUTE stmt;
    RETURN NULL;
EXCEPTION WHEN check_violation THEN
    GET STACKED DIAGNOSTICS name = CONSTRAINT_NAME;
    RETURN name;
END
$fn$;
SELECT is(pg_temp.broken_constraint(format(
        $$UPDATE runrow.agent_run SET claim_token = gen_random_uuid() WHERE id = %L$$, :'bare')),
    'agent_run_no_claim_unless_running', 'the error names the broken rule as its constraint');
-- The six rules are one CHECK whose text is one call: PostgreSQL compiles a CHECK's text for
-- every statement that writes the table (migration 0045). The result's rule (0069) is a second,
-- NOT VALID so that results written before it stay, whose text is a NULL test and one call
-- that is never inlined (measured: +33,254 backend instructions per finish_and_claim_runs call).
SELECT results_eq(
    $$SELECT conname::text COLLATE "default", convalidated FROM pg_constraint
      WHERE conrelid = 'runrow.agent_run'::regclass AND contype = 'c' ORDER BY conname$$,
    $$VALUES ('agent_run_result_portable', false), ('agent_run_state', true)$$,
    'agent_run has two CHECK constraints: the state rules (validated) and the result''s (0069)');
SELECT ok(pg_get_constraintdef((SELECT oid FROM pg_constraint WHERE conname = 'agent_run_state'))
    ~ '^CHECK \(runrow\._agent_run_state_valid\(', 'its expression is one call of _agent_run_state_valid');

-- Runs are never deleted, live or ended; neither table can be truncated.
SELECT throws_ok(format('DELETE FROM runrow.agent_run WHERE id = %L', :'bare'),
    '23000', format('runs are never deleted (run %s)', :'bare'), 'a queued run cannot be deleted');
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        format('DELETE FROM runrow.agent_run WHERE id = %L', :'completed')),
    '23000', format('runs are never deleted (run %s)', :'completed'), 'a finished run cannot be deleted, even by the owner');
SELECT throws_ok('TRUNCATE runrow.agent_run CASCADE', '23000', NULL, 'agent_run cannot be truncated');

-- ---------------------------------------------------------------------------------
-- 4. The journal: append-only, gap-free, at most one complete.
-- ---------------------------------------------------------------------------------
SELECT pg_temp.drain_queue();
SELECT pg_temp.running() AS live \gset
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        format($$UPDATE runrow.run_event SET payload = '{"type": "x"}' WHERE run_id = %L AND seq = 1$$, :'live')),
    '23000', 'run_event is append-only: rows cannot be updated', 'journal rows cannot be updated, even by the owner');
SELECT throws_ok(format($$UPDATE runrow.run_event SET created_at = now() WHERE run_id = %L$$, :'completed'),
    '23000', 'run_event is append-only: rows cannot be updated', 'nor those of an ended run');
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        format('DELETE FROM runrow.run_event WHERE run_id = %L', :'live')),
    '23000', format('run_event is append-only: the journal of run %s is still live', :'live'),
    'the journal of a live run cannot be deleted, even by the owner');
SELECT throws_ok('TRUNCATE runrow.run_event', '23000', 'run_event cannot be truncated', 'run_event cannot be truncated');
-- A journal row names a run that exists (the seq trigger checks it since 0031, a foreign key before).
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        $$INSERT INTO runrow.run_event (run_id, type, payload)
          VALUES ('eeeeeeee-0000-0000-0000-00000000000f', 'text', '{"type": "text"}')$$),
    '23503', 'run_event: run eeeeeeee-0000-0000-0000-00000000000f does not exist',
    'a journal row for a run that does not exist is refused, even for the owner');
SELECT throws_ok(format($$INSERT INTO runrow.run_event (run_id, seq, type, payload)
        VALUES (%L, 5, 'text', '{"type": "text"}')$$, :'live'),
    '23000', format('run_event seq 5 for run %s is out of order: expected 4', :'live'), 'a seq gap is rejected');
SELECT throws_ok(format($$INSERT INTO runrow.run_event (run_id, seq, type, payload)
        VALUES (%L, 3, 'text', '{"type": "text"}')$$, :'live'),
    '23000', format('run_event seq 3 for run %s is out of order: expected 4', :'live'), 'a reused seq is rejected');
SELECT throws_ok(format($$INSERT INTO runrow.run_event (run_id, seq, type, payload)
        VALUES (%L, 4, 'text', '{"type": "text"}'), (%L, 6, 'text', '{"type": "text"}')$$, :'live', :'live'),
    '23000', format('run_event seq 6 for run %s is out of order: expected 5', :'live'),
    'a gap inside one multi-row insert is rejected, all or nothing');
SELECT lives_ok(format($$INSERT INTO runrow.run_event (run_id, seq, type, payload)
        VALUES (%L, 4, 'text', '{"type": "text"}'), (%L, 5, 'text', '{"type": "text"}')$$, :'live', :'live'),
    'the next seqs in one multi-row insert are accepted');
SELECT is(pg_temp.journal(:'live'), ARRAY['user_message_created', 'run_queued', 'run_claimed', 'text', 'text'],
    'the journal is gap-free from 1');
-- A NULL seq is the writers' way (the guard's one lookup of the last seq assigns it), open
-- to anyone who may write the table: the owner too, and still only at the next seq.
SELECT col_not_null('runrow', 'run_event', 'seq', 'seq stays NOT NULL (the guard fills it in before the check)');
SELECT lives_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        format($$INSERT INTO runrow.run_event (run_id, seq, type, payload)
            VALUES (%L, NULL, 'assigned', '{"type": "assigned"}')$$, :'live')),
    'the owner may leave seq NULL');
SELECT is((SELECT seq FROM runrow.run_event WHERE run_id = :'live' AND type = 'assigned'), 6::bigint,
    'a NULL seq is assigned the next one');
WITH ins AS (
    INSERT INTO runrow.run_event (run_id, seq, type, payload)
    SELECT :'live', NULL, x.t, jsonb_build_object('type', x.t)
    FROM unnest(ARRAY['a', 'b', 'c']) WITH ORDINALITY AS x (t, ord)
    ORDER BY x.ord
    RETURNING seq, type
)
SELECT is((SELECT array_agg(seq || ':' || type ORDER BY seq) FROM ins), ARRAY['7:a', '8:b', '9:c'],
    'a multi-row insert of NULL seqs takes the next ones in insert order, read back with RETURNING');
SELECT throws_ok(format($$INSERT INTO runrow.run_event (run_id, seq, type, payload)
        VALUES (%L, NULL, 'text', '{"type": "text"}'), (%L, 9, 'text', '{"type": "text"}')$$, :'live', :'live'),
    '23000', format('run_event seq 9 for run %s is out of order: expected 11', :'live'),
    'an explicit seq that is not the next one is still refused after an assigned one, all or nothing');
SELECT is(pg_temp.journal(:'live'), ARRAY['user_message_created', 'run_queued', 'run_claimed', 'text', 'text',
        'assigned', 'a', 'b', 'c'],
    'the journal is still gap-free from 1');
-- The row's own rules, kept by the guard since 0047 (CHECKs before), with the CHECKs' errors,
-- for the owner too.
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        format($$INSERT INTO runrow.run_event (run_id, type, payload) VALUES (%L, '', '{"type": ""}')$$, :'live')),
    '23514', 'new row for relation "run_event" violates check constraint "run_event_type_check"',
    'an empty type is refused, even for the owner');
SELECT throws_ok(format($$INSERT INTO runrow.run_event (run_id, type, payload) VALUES (%L, 'text', '["text"]')$$,
        :'live'),
    '23514', 'new row for relation "run_event" violates check constraint "run_event_payload_check"',
    'a payload that is not a JSON object is refused');
SELECT throws_ok(format($$INSERT INTO runrow.run_event (run_id, type, payload) VALUES (%L, '', '"text"')$$,
        :'live'),
    '23514', 'new row for relation "run_event" violates check constraint "run_event_type_check"',
    'both broken: the type is reported, as the CHECKs were checked in name order');
SELECT is(pg_temp.broken_constraint(format(
        $$INSERT INTO runrow.run_event (run_id, type, payload) VALUES (%L, 'text', '1')$$, :'live')),
    'run_event_payload_check', 'the error names the rule as its constraint');
SELECT throws_ok(format($$INSERT INTO runrow.run_event (run_id, seq, type, payload) VALUES (%L, 0, '', '1')$$,
        :'live'),
    '23000', format('run_event seq 0 for run %s is out of order: expected 10', :'live'),
    'a seq below 1 is out of order before any row rule');
SELECT is((SELECT count(*)::int FROM pg_constraint WHERE conrelid = 'runrow.run_event'::regclass AND contype = 'c'),
    0, 'run_event has no CHECK constraint to compile per statement (0047)');
SELECT max(seq) AS completed_last FROM runrow.run_event WHERE run_id = :'completed' \gset
SELECT is((SELECT type FROM runrow.run_event WHERE run_id = :'completed' AND seq = :completed_last), 'complete',
    'the ended run''s last journal row is its complete');
SELECT throws_ok(format($$INSERT INTO runrow.run_event (run_id, seq, type, payload)
        VALUES (%L, NULL, 'complete', '{"type": "complete", "status": "failed"}')$$, :'completed'),
    '23505', format('run_event: run %s already has its complete event (seq %s); nothing is journaled after it',
        :'completed', :completed_last),
    'a second complete event is rejected (migration 0039: the seq trigger keeps one complete per run)');
SELECT throws_ok(format($$INSERT INTO runrow.run_event (run_id, seq, type, payload)
        VALUES (%L, %s, 'text', '{"type": "text"}')$$, :'completed', :completed_last + 1),
    '23505', format('run_event: run %s already has its complete event (seq %s); nothing is journaled after it',
        :'completed', :completed_last),
    'so is any event after it, even at the next seq');

-- ---------------------------------------------------------------------------------
-- The prompt registry and the messages.
-- ---------------------------------------------------------------------------------
SELECT prompt_id AS prompt, user_message_id AS msg FROM runrow.agent_run WHERE id = :'live' \gset
SELECT throws_ok(format($$UPDATE runrow.prompt SET system_prompt = 'changed' WHERE id = %L$$, :'prompt'),
    '23000', format('prompt %s is immutable: register a new prompt instead', :'prompt'), 'a prompt cannot be changed');
SELECT throws_ok(format('DELETE FROM runrow.prompt WHERE id = %L', :'prompt'),
    '23000', format('prompt %s is never deleted: runs refer to it by its id', :'prompt'),
    'a prompt a run references cannot be deleted');
SELECT throws_ok(format($$UPDATE runrow.message SET content = '"edited"' WHERE id = %L$$, :'msg'),
    '23000', format('message %s: only submitted -> draft may change', :'msg'), 'a message''s content cannot change');
SELECT lives_ok(format($$UPDATE runrow.message SET status = 'draft' WHERE id = %L$$, :'msg'),
    'submitted -> draft is the one change a message may take');
SELECT throws_ok(format($$UPDATE runrow.message SET status = 'submitted' WHERE id = %L$$, :'msg'),
    '23000', format('message %s: only submitted -> draft may change', :'msg'), 'draft -> submitted is rejected');
SELECT throws_ok(format('DELETE FROM runrow.message WHERE id = %L', :'msg'),
    '23000', 'messages are never deleted', 'a message cannot be deleted');

-- ---------------------------------------------------------------------------------
-- A run's request (run_request, 0061): for a run that exists, never edited, dropped only once
-- the run has ended (trim_journal's delete), even by the owner.
-- ---------------------------------------------------------------------------------
SELECT pg_temp.new_run() AS open_run \gset
-- Its key is the database clock's, whatever the writer gives: trim_journal's walk stops at the
-- cutoff's millisecond, and a key from the future would keep a request from it forever.
SELECT lives_ok(format($$SET LOCAL session_replication_role = replica;
        DELETE FROM runrow.run_request WHERE run_id = %L; SET LOCAL session_replication_role = origin$$, :'open_run'),
    'its request removed around the triggers, to be written again by hand');
SELECT lives_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        format($$INSERT INTO runrow.run_request (id, run_id, snapshot)
                 VALUES ('ffffffff-ffff-7fff-bfff-ffffffffffff', %L, '{"content": "again"}')$$, :'open_run')),
    'the owner writes a request with a key far in the future');
SELECT is((SELECT substr(id::text, 1, 13) FROM runrow.run_request WHERE run_id = :'open_run'),
    substr(runrow._uuidv7()::text, 1, 13), 'it is keyed by now() instead');
SELECT throws_ok($$INSERT INTO runrow.run_request (run_id, snapshot) VALUES (gen_random_uuid(), '{}')$$,
    '23503', 'insert or update on table "run_request" violates foreign key constraint "run_request_run_id_fkey"',
    'a request for a run that does not exist is refused, as its foreign key would');
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        format($$UPDATE runrow.run_request SET snapshot = '{}' WHERE run_id = %L$$, :'open_run')),
    '23000', 'run_request rows are never updated', 'the owner cannot edit a run''s request');
SELECT throws_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        format('DELETE FROM runrow.run_request WHERE run_id = %L', :'open_run')),
    '23000', format('run %s is not terminal: its request is kept until it ends', :'open_run'),
    'nor drop the request of a run that has not ended');
SELECT throws_ok('TRUNCATE runrow.run_request', '23000', 'run_request cannot be truncated',
    'run_request cannot be truncated');
SELECT is((SELECT count(*)::int FROM runrow.run_request WHERE run_id = :'open_run'), 1, 'so the open run keeps its request');
SELECT lives_ok(format('SELECT pg_temp.as_role(%L, %L)', :'owner',
        format('DELETE FROM runrow.run_request WHERE run_id = %L', :'completed')),
    'an ended run''s request can be dropped (trim_journal)');
SELECT is((SELECT count(*)::int FROM runrow.run_request WHERE run_id = :'completed'), 0, 'and is gone');

SELECT * FROM finish();
ROLLBACK;
