-- runrow._claim_walk: the claim's walk, shared by _claim and finish_and_claim_runs. It checks
-- the claim's arguments before anything is written, locks the runs that may start now in claim
-- order and returns them with when each was queued, and claims nothing itself (its callers'
-- one UPDATE does). It carries no SET clauses: it runs under its callers' plan settings.
BEGIN;
\ir helpers/setup.psql
\ir helpers/row_versions.psql
\ir helpers/lifecycle.psql
SELECT plan(15);
SELECT pg_temp.drain_queue();

\set sig '''{text,integer,integer}'''
SELECT has_function('runrow', '_claim_walk', :sig::name[], '_claim_walk(worker_id, max_runs, lease_seconds) exists');
SELECT isnt_definer('runrow', '_claim_walk', :sig::name[], '_claim_walk runs as its caller (a SECURITY DEFINER function)');
SELECT is((SELECT proconfig FROM pg_proc WHERE oid = 'runrow._claim_walk(text, integer, integer)'::regprocedure),
    NULL, 'it carries no SET clauses: its callers pin the search_path and the plan settings');
SELECT is_empty($$SELECT r FROM unnest(ARRAY['runrow_worker', 'runrow_client', 'runrow_auditor']) AS r
    WHERE has_function_privilege(r, 'runrow._claim_walk(text, integer, integer)', 'EXECUTE')$$,
    'no runrow role may call it around the claim''s write');

-- Locks in claim order, writes no claim. Three fresh conversations and one turn queued behind
-- a running one.
\set conv '''eeeeeeee-0000-0000-0000-0000000000b1'''
SELECT pg_temp.running(conv => :conv) AS ahead \gset
SELECT pg_temp.new_run(:conv) AS behind \gset
SELECT pg_temp.new_run() AS w1 \gset
SELECT pg_temp.new_run() AS w2 \gset
SELECT pg_temp.new_run() AS w3 \gset
SELECT count(*) AS journal_rows FROM runrow.run_event \gset
CREATE TEMP TABLE walked AS SELECT * FROM runrow._claim_walk('w', 2, 30);
SELECT results_eq('SELECT locked FROM walked', format($$VALUES (ARRAY[%L, %L]::uuid[])$$, :'w1', :'w2'),
    'it locks max_runs runs in claim order, past the turn that waits behind a running one');
SELECT results_eq('SELECT locked_since FROM walked',
    format($$SELECT ARRAY[(SELECT updated_at FROM runrow.agent_run WHERE id = %L),
                          (SELECT updated_at FROM runrow.agent_run WHERE id = %L)]$$, :'w1', :'w2'),
    'with when each became claimable, read with its lock');
SELECT results_eq(format($$SELECT status, claim_token FROM runrow.agent_run WHERE id = ANY (ARRAY[%L, %L, %L]::uuid[])$$,
        :'w1', :'w2', :'w3'),
    $$VALUES ('queued'::text, NULL::uuid), ('queued', NULL), ('queued', NULL)$$,
    'the runs it locked are still queued, with no token: it claims nothing');
SELECT is((SELECT count(*) FROM runrow.run_event), :'journal_rows'::bigint, 'and journals nothing');
SELECT ok((SELECT xmax::text::bigint = txid_current() % 4294967296 FROM runrow.agent_run WHERE id = :'w1'),
    'w1 is row-locked by this transaction');
SELECT is((SELECT xmax::text FROM runrow.agent_run WHERE id = :'w3'), '0', 'w3, past max_runs, is not locked');
SELECT is((SELECT claim_blocked FROM runrow.agent_run WHERE id = :'behind'), true,
    'the turn behind a running one was marked blocked, so later walks pass it by');

-- Bad arguments: the error names the argument, and nothing is written or locked.
SELECT pg_temp.written() AS before \gset
SELECT throws_ok('SELECT * FROM runrow._claim_walk(''w'', 0, 30)', '22023',
    'max_runs must be between 1 and 1000, got 0', 'max_runs 0');
SELECT throws_ok('SELECT * FROM runrow._claim_walk(''w'', 1, NULL)', '22004',
    'lease_seconds must not be NULL', 'lease_seconds NULL (checked here, before the walk writes, though only the write uses it)');
SELECT throws_ok('SELECT * FROM runrow._claim_walk('''', 1, 30)', '22023',
    'worker_id must be NULL or 1 to 200 characters', 'worker_id empty');
SELECT is(pg_temp.written(), :'before', 'no bad call wrote anything');

SELECT * FROM finish();
ROLLBACK;
