-- agent_run's indexes (migrations 0021, 0032, 0035, 0036, 0040): neither the claim nor the finish can be a HOT update,
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
        'agent_run_untrimmed',
        'agent_run_trimmed',
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
-- A finished run is indexed by finished_at once (0040): in agent_run_untrimmed while its
-- journal is there, in agent_run_trimmed after trim_journal. Every window of history is read
-- through both, never the whole table (an OR of two indexes is a bitmap scan).
SET LOCAL enable_bitmapscan = on;
SELECT hasnt_index('runrow', 'agent_run', 'agent_run_finished_idx',
    'no index of all finished runs beside the untrimmed and the trimmed ones (0040)');
SELECT ok(
    w.p ~ 'agent_run_untrimmed' AND w.p ~ 'agent_run_trimmed',
    'a window of finished runs is read through agent_run_untrimmed and agent_run_trimmed together'
)
FROM (SELECT pg_temp.plan_of($$SELECT count(*) FROM runrow.agent_run AS a
        WHERE a.finished_at >= now() - interval '1 hour'
          AND (a.request_snapshot IS NOT NULL OR a.request_snapshot IS NULL)$$) AS p) AS w;
-- Which index a view's plan takes depends on the table's statistics (an empty table here), so
-- the views are held to the filter that makes both indexes usable; dba_views.sql counts a
-- trimmed run in each.
SELECT ok(
    (SELECT bool_and(pg_get_viewdef(v::regclass)
                     ~ 'request_snapshot IS NOT NULL\) OR \(a\.request_snapshot IS NULL')
     FROM unnest(ARRAY['runrow.run_stats', 'runrow.run_attempts', 'runrow.spend_by_run']) AS v),
    'run_stats, run_attempts and spend_by_run read their day of history with one arm per index'
);
SELECT ok(
    v.p !~ 'Seq Scan' AND v.p ~ 'agent_run_queued_by_conversation' AND v.p ~ 'agent_run_one_active_per_conversation'
    AND v.p ~ 'agent_run_untrimmed' AND v.p ~ 'agent_run_trimmed',
    'spend_by_run reads the queued, the active and the day''s finished runs through their indexes, not the table'
)
FROM (SELECT pg_temp.plan_of('SELECT * FROM runrow.spend_by_run') AS p) AS v;
SELECT ok(
    w.p ~ 'Index Scan using agent_run_untrimmed' AND w.p !~ 'agent_run_trimmed',
    'trim_journal''s work list is agent_run_untrimmed alone, never the trimmed history'
)
FROM (SELECT pg_temp.plan_of($$SELECT a.id FROM runrow.agent_run AS a
        WHERE a.finished_at < now() AND a.finished_at IS NOT NULL AND a.request_snapshot IS NOT NULL
        ORDER BY a.finished_at LIMIT 10$$) AS p) AS w;
-- Each finished run is in exactly one of the two: the predicates split on request_snapshot.
SELECT is(
    (SELECT array_agg(pg_get_expr(i.indpred, i.indrelid) ORDER BY c.relname)
     FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
     WHERE i.indrelid = 'runrow.agent_run'::regclass AND c.relname IN ('agent_run_untrimmed', 'agent_run_trimmed')),
    ARRAY['((finished_at IS NOT NULL) AND (request_snapshot IS NULL))',
          '((finished_at IS NOT NULL) AND (request_snapshot IS NOT NULL))'],
    'agent_run_trimmed and agent_run_untrimmed split the finished runs by request_snapshot'
);
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
