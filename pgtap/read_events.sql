-- runrow.read_events: cursor, paging, the synthesized complete (trimmed journal, dead
-- finalizer), read-only, unknown run, bad input.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(34);
SELECT pg_temp.drain_queue();

SELECT has_function('runrow', 'read_events', ARRAY['uuid', 'bigint', 'integer'],
    'read_events(run_id, after_seq, max_events) exists');

-- A live run with 3 lifecycle events and 5 of its own: seqs 1..8.
SELECT pg_temp.running() AS run \gset
SELECT runrow.append_events(:'run', pg_temp.token(:'run'),
    (SELECT jsonb_agg(jsonb_build_object('type', 'text', 'i', i)) FROM generate_series(1, 5) AS i));
SELECT pg_temp.fingerprint() AS before \gset

SELECT results_eq(format('SELECT seq, type FROM runrow.read_events(%L)', :'run'),
    $$VALUES (1::bigint, 'user_message_created'), (2, 'run_queued'), (3, 'run_claimed'),
             (4, 'text'), (5, 'text'), (6, 'text'), (7, 'text'), (8, 'text')$$,
    'from the start: every event in seq order');
SELECT is((SELECT payload FROM runrow.read_events(:'run') WHERE seq = 5), '{"type": "text", "i": 2}'::jsonb,
    'payload is the event object as written, type included');
SELECT is((SELECT count(*)::int FROM runrow.read_events(:'run') AS e WHERE e.payload ->> 'type' = e.type), 8,
    'the type column is the payload''s type');
SELECT results_eq(format('SELECT seq FROM runrow.read_events(%L, after_seq => 3)', :'run'),
    'VALUES (4::bigint), (5), (6), (7), (8)', 'after_seq is an exclusive cursor');

-- Paging: max_events per call, the last seq is the next cursor.
SELECT results_eq(format('SELECT seq FROM runrow.read_events(%L, 3, 2)', :'run'),
    'VALUES (4::bigint), (5)', 'page 1 of 2 events');
SELECT results_eq(format('SELECT seq FROM runrow.read_events(%L, 5, 2)', :'run'),
    'VALUES (6::bigint), (7)', 'page 2');
SELECT results_eq(format('SELECT seq FROM runrow.read_events(%L, 7, 2)', :'run'),
    'VALUES (8::bigint)', 'the last, short page');
SELECT is_empty(format('SELECT * FROM runrow.read_events(%L, 8)', :'run'),
    'at the end of a live run''s journal: no rows, nothing synthesized');
SELECT is_empty(format('SELECT * FROM runrow.read_events(%L, 100)', :'run'),
    'past the end of a live run''s journal: no rows');
SELECT is(pg_temp.fingerprint(), :'before', 'reading writes nothing');

-- The run ends: the real complete, not a synthesized one.
SELECT runrow.finish_run(:'run', pg_temp.token(:'run'), 'completed', '{"text": "hi"}');
SELECT is((SELECT payload FROM runrow.read_events(:'run', 8)),
    '{"type": "complete", "status": "completed", "result": {"text": "hi"}, "error": null}'::jsonb,
    'a finished run''s complete is read as journaled');
SELECT pg_temp.fingerprint() AS before \gset
SELECT results_eq(format('SELECT seq, type, payload FROM runrow.read_events(%L, 9)', :'run'),
    $$VALUES (10::bigint, 'complete'::text, '{"type": "complete", "status": "completed", "result": {"text": "hi"},
        "error": null, "synthesized": true, "complete_seq": 9}'::jsonb)$$,
    'at the journaled complete: a terminal run''s read still ends in a complete, synthesized, naming complete_seq');
SELECT results_eq(format('SELECT seq, payload ->> ''complete_seq'' FROM runrow.read_events(%L, 5000)', :'run'),
    $$VALUES (5001::bigint, '9'::text)$$,
    'a cursor far past a terminal run''s journal (stale): the ending at after_seq + 1, never a wait');
SELECT results_eq(format('SELECT seq, type FROM runrow.read_events(%L, 7)', :'run'),
    $$VALUES (8::bigint, 'text'), (9, 'complete')$$,
    'before the complete: the journal''s own complete, nothing synthesized');
SELECT is(pg_temp.fingerprint(), :'before', 'synthesizing the ending of a finished run writes nothing');

-- Trimmed journal: a complete is synthesized from the row.
SELECT pg_temp.finished('completed') AS trimmed \gset
SELECT pg_temp.age_finished(:'trimmed', '2 days');
SELECT ok(runrow.trim_journal('1 day') > 0, 'the journal is trimmed');
SELECT pg_temp.fingerprint() AS before \gset
SELECT results_eq(format('SELECT seq, type, payload, created_at FROM runrow.read_events(%L)', :'trimmed'),
    format($$SELECT 1::bigint, 'complete'::text,
        '{"type": "complete", "status": "completed", "result": {"text": "done"}, "error": null, "synthesized": true}'::jsonb,
        finished_at FROM runrow.agent_run WHERE id = %L$$, :'trimmed'),
    'a trimmed run reads as one synthesized complete at seq 1, stamped finished_at');
SELECT is((SELECT seq FROM runrow.read_events(:'trimmed', 5)), 6::bigint,
    'with a cursor past the trimmed journal the frame is at after_seq + 1');
SELECT is(pg_temp.fingerprint(), :'before', 'synthesizing writes nothing');

-- A finalizer that died mid-way: terminal row, journal without its complete.
SELECT pg_temp.running() AS died \gset
SELECT runrow.append_events(:'died', pg_temp.token(:'died'), '[{"type": "text"}]');
SELECT runrow.finish_run(:'died', pg_temp.token(:'died'), 'failed', NULL, 'boom');
DELETE FROM runrow.run_event WHERE run_id = :'died' AND type = 'complete';
SELECT is(pg_temp.journal(:'died'), ARRAY['user_message_created', 'run_queued', 'run_claimed', 'text'],
    'the journal lost its complete');
SELECT results_eq(format('SELECT seq, type FROM runrow.read_events(%L)', :'died'),
    $$VALUES (1::bigint, 'user_message_created'), (2, 'run_queued'), (3, 'run_claimed'), (4, 'text'), (5, 'complete')$$,
    'the stream ends with a complete at the next seq');
SELECT is((SELECT payload FROM runrow.read_events(:'died') WHERE seq = 5),
    '{"type": "complete", "status": "failed", "result": null, "error": "boom", "synthesized": true}'::jsonb,
    'built from the row: status, result, error, synthesized');
SELECT results_eq(format('SELECT seq FROM runrow.read_events(%L, 4)', :'died'), 'VALUES (5::bigint)',
    'a reader at the end gets just the synthesized frame');
SELECT results_eq(format('SELECT seq FROM runrow.read_events(%L, 2, 2)', :'died'), 'VALUES (3::bigint), (4)',
    'not synthesized when the page is full: the reader is not at the end yet');
SELECT results_eq(format('SELECT seq FROM runrow.read_events(%L, 2, 3)', :'died'),
    'VALUES (3::bigint), (4), (5)', 'synthesized on the page that reaches the end');

-- Unknown run and bad input, on a live run: errors, nothing written.
SELECT pg_temp.running() AS live \gset
SELECT pg_temp.fingerprint() AS before \gset
SELECT throws_ok('SELECT * FROM runrow.read_events(''00000000-0000-0000-0000-000000000000'')', 'P0002',
    'run_id 00000000-0000-0000-0000-000000000000 does not exist', 'an unknown run_id raises P0002');
SELECT throws_ok('SELECT * FROM runrow.read_events(NULL, 0, 10)', '22004', 'run_id must not be NULL',
    'run_id NULL is rejected');
SELECT throws_ok(format('SELECT * FROM runrow.read_events(%L, NULL, 10)', :'live'), '22004',
    'after_seq must not be NULL', 'after_seq NULL is rejected');
SELECT throws_ok(format('SELECT * FROM runrow.read_events(%L, -1, 10)', :'live'), '22023',
    'after_seq must be between 0 and 9223372036854775806, got -1', 'a negative after_seq is rejected');
SELECT throws_ok(format('SELECT * FROM runrow.read_events(%L, 0, NULL)', :'live'), '22004',
    'max_events must not be NULL', 'max_events NULL is rejected');
SELECT throws_ok(format('SELECT * FROM runrow.read_events(%L, 0, 0)', :'live'), '22023',
    'max_events must be between 1 and 10000, got 0', 'max_events 0 is rejected');
SELECT throws_ok(format('SELECT * FROM runrow.read_events(%L, 0, 10001)', :'live'), '22023',
    'max_events must be between 1 and 10000, got 10001', 'max_events 10001 is rejected');
SELECT is(pg_temp.fingerprint(), :'before', 'bad input wrote nothing');

SELECT * FROM finish();
ROLLBACK;
