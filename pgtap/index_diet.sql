-- agent_run's indexes (migrations 0021, 0032, 0035, 0036, 0040, 0061): neither the claim nor the finish can be a HOT update,
-- so every index is paid for on every write of a run. The list is pinned here so adding one
-- is a decision a reviewer sees, and the per-conversation order is a constraint, not a habit.
BEGIN;
\ir helpers/setup.psql
SELECT plan(19);

CREATE FUNCTION pg_temp.plan_of(query text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE line text; plan text := '';
BEGIN
    FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || query LOOP plan := plan || line || E'\n'; END LOOP;
    RETURN plan;
END $$;

SELECT indexes_are(
    'runrow', 'agent_run',
    ARRAY[
        'agent_run_pkey',
        'agent_run_ended_by_conversation',
        'agent_run_one_active_per_conversation',
        'agent_run_idempotency_key',
        'agent_run_one_retry',
        'agent_run_terminal_anomaly',
        'agent_run_finished',
        'agent_run_queued_by_conversation',
        'agent_run_claimable',
        'agent_run_delayed',
        'agent_run_open_by_concurrency_key'
    ],
    'agent_run has exactly the indexes its lookups use'
);
SELECT hasnt_index('runrow', 'agent_run', 'agent_run_enqueue_seq_key', 'no unique index on enqueue_seq alone');
SELECT hasnt_index('runrow', 'agent_run', 'agent_run_conversation_idx', 'no (conversation_id, created_at) index');
SELECT hasnt_index('runrow', 'agent_run', 'agent_run_running', 'no index of running runs by worker (0032)');
SELECT hasnt_index('runrow', 'agent_run', 'agent_run_conversation_turn',
    'no index of all of a conversation''s turns: open and ended are two (0035)');

-- Two turns of one conversation can never share a place in its order: enqueue_seq is an
-- identity column, and even the table owner forcing a value hits the unique index of the part
-- (open or ended) the run is in.
SELECT gen_random_uuid() AS c1 \gset
SELECT run_id AS r1 FROM runrow.enqueue_run(:'c1', '"one"', 'test-model') \gset
SELECT throws_ok(
    format($q$
        INSERT INTO runrow.agent_run (id, enqueue_seq, conversation_id, user_message_id, prompt_id, model)
        OVERRIDING SYSTEM VALUE
        SELECT gen_random_uuid(), a.enqueue_seq, a.conversation_id, a.user_message_id, a.prompt_id, a.model
        FROM runrow.agent_run AS a WHERE a.id = %L
    $q$, :'r1'),
    '23505', NULL,
    'a second turn at the same place in a conversation is refused (agent_run_queued_by_conversation)'
);

-- The readers of a conversation's turns read the open part and the ended part, each through
-- its own index, in turn order.
SET LOCAL enable_seqscan = off;
SET LOCAL enable_bitmapscan = off;
SELECT ok(
    pg_temp.plan_of(format($q$SELECT id FROM runrow.agent_run WHERE conversation_id = %L
        AND status IN ('completed', 'failed', 'cancelled', 'dead') ORDER BY enqueue_seq$q$, :'c1'))
    ~ 'Index (Only )?Scan (Backward )?(using|on) agent_run_ended_by_conversation',
    'a conversation''s ended turns in turn order are read from agent_run_ended_by_conversation'
);
SELECT ok(
    pg_temp.plan_of(format($q$SELECT id FROM runrow.agent_run WHERE conversation_id = %L
        AND status = 'queued' AND enqueue_seq < 1000000 ORDER BY enqueue_seq$q$, :'c1'))
    ~ 'Index (Only )?Scan (Backward )?(using|on) agent_run_queued_by_conversation',
    'its queued turns from agent_run_queued_by_conversation, never the queue''s own index'
);
SELECT ok(
    pg_temp.plan_of(format($q$SELECT id FROM runrow.agent_run WHERE conversation_id = %L
        AND status IN ('running', 'waiting')$q$, :'c1'))
    ~ 'Index (Only )?Scan (Backward )?(using|on) agent_run_one_active_per_conversation',
    'its active turn from agent_run_one_active_per_conversation'
);
SELECT hasnt_index('runrow', 'agent_run', 'agent_run_open_by_conversation',
    'no index of open turns beside the queued and the active ones (0036)');
-- Every running run (the reaper, audit(), queue_health) is still read through an index, never
-- the whole table.
SELECT ok(
    pg_temp.plan_of($$SELECT a.id FROM runrow.agent_run AS a WHERE a.status = 'running'
        AND a.claim_expires_at < now() ORDER BY a.claim_expires_at LIMIT 100 FOR NO KEY UPDATE SKIP LOCKED$$)
    ~ 'Index (Only )?Scan (Backward )?(using|on) agent_run_one_active_per_conversation',
    'the reaper reads the running runs through agent_run_one_active_per_conversation'
);
SELECT ok(
    pg_temp.plan_of($$SELECT count(*) FROM runrow.agent_run AS a WHERE a.status = 'running'$$)
    ~ 'Index (Only )?Scan (Backward )?(using|on) agent_run_one_active_per_conversation',
    'so does a count of running runs (queue_health)'
);
-- A finished run is indexed by finished_at once, at its ending, in agent_run_finished; since
-- 0061 nothing writes it again (trim_journal deletes its run_request row), so 0040's two
-- indexes of untrimmed and trimmed runs are one. Every window of history is read through it,
-- never the whole table (spend_by_run's OR of three indexes is a bitmap scan).
SET LOCAL enable_bitmapscan = on;
SELECT hasnt_index('runrow', 'agent_run', 'agent_run_untrimmed', 'no index of untrimmed runs (0061)');
SELECT hasnt_index('runrow', 'agent_run', 'agent_run_trimmed', 'no index of trimmed runs (0061)');
SELECT is(
    (SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index AS i
     WHERE i.indexrelid = 'runrow.agent_run_finished'::regclass),
    '(finished_at IS NOT NULL)', 'agent_run_finished holds every finished run'
);
SELECT ok(
    w.p ~ 'agent_run_finished' AND w.p !~ 'Seq Scan',
    'a window of finished runs is read through agent_run_finished'
)
FROM (SELECT pg_temp.plan_of($$SELECT count(*) FROM runrow.agent_run AS a
        WHERE a.finished_at >= now() - interval '1 hour'$$) AS p) AS w;
SELECT ok(
    v.p !~ 'Seq Scan' AND v.p ~ 'agent_run_queued_by_conversation' AND v.p ~ 'agent_run_one_active_per_conversation'
    AND v.p ~ 'agent_run_finished',
    'spend_by_run reads the queued, the active and the day''s finished runs through their indexes, not the table'
)
FROM (SELECT pg_temp.plan_of('SELECT * FROM runrow.spend_by_run') AS p) AS v;
-- trim_journal's work list (its query): run_request in its key's order (enqueue time), each
-- run's row by its primary key; never agent_run_finished, which would walk the trimmed history.
SELECT ok(
    w.p ~ 'Index Scan using run_request_pkey' AND w.p ~ 'agent_run_pkey' AND w.p !~ 'agent_run_finished'
    AND w.p !~ 'Sort' AND w.p !~ 'Seq Scan',
    'trim_journal''s work list is run_request''s key in order, never the trimmed history'
)
FROM (SELECT pg_temp.plan_of($$SELECT q.run_id FROM runrow.run_request AS q
        WHERE q.id < '01900000-0000-0000-0000-000000000000'
          AND (SELECT a.finished_at FROM runrow.agent_run AS a WHERE a.id = q.run_id) < now()
        ORDER BY q.id LIMIT 10$$) AS p) AS w;
SELECT ok(
    NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conrelid = 'runrow.agent_run'::regclass AND contype = 'u'
          AND conkey = ARRAY[(SELECT attnum FROM pg_attribute
                               WHERE attrelid = 'runrow.agent_run'::regclass AND attname = 'enqueue_seq')]
    ),
    'enqueue_seq is unique by its identity, not by an index of its own'
);

SELECT * FROM finish();
ROLLBACK;
