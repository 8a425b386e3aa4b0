-- The claim walk's batch step, shared by the walk's fast path (a queue that is one keyless
-- group) and its serve loop (a level whose one tenant has one keyless group): with one tenant,
-- no concurrency key and no fleet limit that can bite, every rule of the claim but turn order is
-- moot, and the order is just the group's arrival order. So the group's next runs are locked in
-- one statement instead of one head, probe and lock each, each probed for turn order as the
-- walk's per-candidate check does (before the lock, a filter: agent_run's trigger is the
-- guarantee). Runs found blocked are re-checked in a later statement (a fresh snapshot, taken
-- under our locks) and marked only if still blocked; a run found free after all is left
-- locked and unclaimed for the next claim. Only for READ COMMITTED callers: elsewhere a blocked
-- turn must not even be locked. No SET clauses: it runs under its callers' plan settings.
CREATE OR REPLACE FUNCTION runrow._claim_batch_step(
    -- The group: its priority, its tenant ('' for none) and the first seq to read.
    lvl integer, tenant text, after bigint, want integer,
    -- The free runs it locked, in claim order, and when each was queued; the last seq it read
    -- and how many runs it locked, the blocked ones included (fewer than want: the group's
    -- range is read to its end, SKIP LOCKED rows not counting against the LIMIT).
    OUT ids uuid[], OUT since timestamptz[], OUT last_seq bigint, OUT locked_count integer
)
LANGUAGE plpgsql
AS $fn$
DECLARE
    all_ids uuid[];
    all_since timestamptz[];
    flagged uuid[];
BEGIN
    -- The probes are scalar subqueries, not EXISTS: an EXISTS here could be planned as a
    -- hashed subplan that reads every active run.
    SELECT array_agg(b.id ORDER BY b.enqueue_seq),
           array_agg(b.updated_at ORDER BY b.enqueue_seq),
           array_agg(b.id) FILTER (WHERE b.blocked),
           max(b.enqueue_seq),
           count(*)
    INTO all_ids, all_since, flagged, last_seq, locked_count
    FROM (
        SELECT q.id, q.updated_at, q.enqueue_seq,
               (SELECT 1 FROM runrow.agent_run AS a
                WHERE a.conversation_id = q.conversation_id
                  AND a.status IN ('running', 'waiting')
                LIMIT 1) IS NOT NULL
               OR (SELECT 1 FROM runrow.agent_run AS o
                   WHERE o.conversation_id = q.conversation_id
                     AND o.status = 'queued'
                     AND o.enqueue_seq < q.enqueue_seq
                   LIMIT 1) IS NOT NULL AS blocked
        FROM runrow.agent_run AS q
        WHERE q.status = 'queued' AND NOT q.claim_blocked AND q.not_before IS NULL
          AND q.priority = _claim_batch_step.lvl AND coalesce(q.fairness_key, '') = _claim_batch_step.tenant
          AND coalesce(q.concurrency_key, '') = '' AND q.enqueue_seq >= _claim_batch_step.after
        ORDER BY q.priority DESC, coalesce(q.fairness_key, ''), coalesce(q.concurrency_key, ''), q.enqueue_seq
        LIMIT _claim_batch_step.want
        FOR UPDATE OF q SKIP LOCKED
    ) AS b;
    IF flagged IS NULL THEN
        ids := all_ids;
        since := all_since;
        RETURN;
    END IF;
    UPDATE runrow.agent_run AS q SET claim_blocked = true, updated_at = now()
    WHERE q.id = ANY (flagged)
      AND ((SELECT 1 FROM runrow.agent_run AS a
            WHERE a.conversation_id = q.conversation_id
              AND a.status IN ('running', 'waiting')
            LIMIT 1) IS NOT NULL
           OR (SELECT 1 FROM runrow.agent_run AS o
               WHERE o.conversation_id = q.conversation_id
                 AND o.status = 'queued'
                 AND o.enqueue_seq < q.enqueue_seq
               LIMIT 1) IS NOT NULL);
    ids := '{}';
    since := '{}';
    FOR i IN 1 .. locked_count LOOP
        CONTINUE WHEN all_ids[i] = ANY (flagged);
        ids := ids || all_ids[i];
        since := since || all_since[i];
    END LOOP;
END
$fn$;

REVOKE ALL ON FUNCTION runrow._claim_batch_step(integer, text, bigint, integer) FROM PUBLIC;
