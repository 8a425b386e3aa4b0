-- runrow.claim_run: happy path, turn order, fencing, bad input.
BEGIN;
\ir helpers/setup.psql
SELECT plan(20);
SELECT pg_temp.drain_queue();

SELECT has_function('runrow', 'claim_run', ARRAY['text', 'integer'], 'claim_run(worker_id, lease_seconds) exists');
SELECT is_empty('SELECT * FROM runrow.claim_run(''w'')', 'an empty queue claims nothing');

-- Happy path: the oldest queued run becomes running with a token, a lease, the worker.
\set conv '''aaaaaaaa-0000-0000-0000-000000000001'''
SELECT pg_temp.new_run(:conv) AS first \gset
SELECT pg_temp.new_run(:conv) AS second \gset
SELECT pg_temp.new_run() AS other \gset
CREATE TEMP TABLE c1 AS SELECT * FROM runrow.claim_run(worker_id => 'w1', lease_seconds => 20);
SELECT is((SELECT run_id FROM c1), :'first'::uuid, 'claims the oldest queued run');
SELECT is((SELECT attempt FROM c1), 1, 'attempt becomes 1');
SELECT is((SELECT model FROM c1), 'test-model', 'returns the pinned model');
SELECT ok((SELECT claim_token IS NOT NULL FROM c1), 'returns a claim token');
SELECT is(
    (SELECT (status, worker_id, claim_token, claim_expires_at)::text FROM runrow.agent_run WHERE id = :'first'),
    (SELECT ('running', 'w1', claim_token, now() + interval '20 seconds')::text FROM c1),
    'the row is running with that token, worker and a lease on the database clock');
SELECT is(
    (SELECT type FROM runrow.run_event WHERE run_id = :'first' ORDER BY seq DESC LIMIT 1),
    'run_claimed', 'run_claimed is journaled');

-- Turn order + one active run per conversation: the second turn is skipped, the
-- other conversation's run is taken.
CREATE TEMP TABLE c2 AS SELECT * FROM runrow.claim_run(worker_id => 'w2');
SELECT is((SELECT run_id FROM c2), :'other'::uuid,
    'the second turn of a busy conversation is skipped; another conversation''s run is claimed');
SELECT is_empty('SELECT * FROM runrow.claim_run(''w3'')', 'nothing else is claimable');

-- Waiting also holds the conversation.
SELECT runrow.finish_run(:'first', (SELECT claim_token FROM c1), 'completed');
SELECT is((SELECT run_id FROM runrow.claim_run('w4')), :'second'::uuid,
    'once the first turn ends, the second is claimable');

-- queued_seconds: the wait since the run became claimable, on the database clock (the
-- enqueue is pushed 42 s back, triggers skipped, as the owner may in a test).
SELECT runrow.finish_run(:'second', (SELECT claim_token FROM runrow.agent_run WHERE id = :'second'), 'completed');
SELECT runrow.finish_run(:'other', (SELECT claim_token FROM c2), 'completed');
SELECT pg_temp.new_run() AS waited \gset
SET LOCAL session_replication_role = replica;
UPDATE runrow.agent_run SET updated_at = now() - interval '42 seconds' WHERE id = :'waited';
SET LOCAL session_replication_role = origin;
SELECT is((SELECT (run_id, queued_seconds)::text FROM runrow.claim_run('w5')),
    (:'waited'::uuid, 42::double precision)::text, 'queued_seconds says how long the claimed run waited');

-- Fenced out / stale: a run that already ended is never claimed again.
SELECT is((SELECT status FROM runrow.agent_run WHERE id = :'first'), 'completed',
    'an ended run stays ended');
SELECT is_empty('SELECT * FROM runrow.claim_run(''w5'')', 'ended and running runs are not claimable');

-- Bad input: clear SQLSTATE, the argument named, nothing written.
SELECT pg_temp.new_run() AS queued \gset
SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok('SELECT * FROM runrow.claim_run(''w'', 0)', '22023',
    'lease_seconds must be between 1 and 3600, got 0', 'lease_seconds 0 is rejected');
SELECT throws_ok('SELECT * FROM runrow.claim_run(''w'', 3601)', '22023', NULL, 'lease_seconds 3601 is rejected');
SELECT throws_ok('SELECT * FROM runrow.claim_run(''w'', NULL)', '22004',
    'lease_seconds must not be NULL', 'lease_seconds NULL is rejected');
SELECT throws_ok('SELECT * FROM runrow.claim_run('''', 30)', '22023',
    'worker_id must be NULL or 1 to 200 characters', 'an empty worker_id is rejected');
SELECT is(pg_temp.fingerprint(), :'before', 'bad input wrote nothing');
SELECT is((SELECT status FROM runrow.agent_run WHERE id = :'queued'), 'queued', 'the queued run is still queued');

SELECT * FROM finish();
ROLLBACK;
