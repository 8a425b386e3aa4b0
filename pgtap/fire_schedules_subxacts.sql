-- runrow._fire_schedules commits at most 64 subtransactions that write per call
-- (PGPROC_MAX_CACHED_SUBXIDS): each tick's enqueue is one BEGIN ... EXCEPTION block, two with
-- if_active = interrupt (the stop's own block). A 65th overflows the backend's subxid cache and
-- marks every snapshot in the cluster overflowed while the transaction lasts (pg_subtrans
-- lookups for every row written since). Counted here as the distinct xmins of the rows the
-- call wrote to agent_run: every tick's block inserts its run there, every stop's block updates
-- the run it stops, and nothing else of the call writes it.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(13);
SELECT pg_temp.drain_queue();
DELETE FROM runrow.schedule;

CREATE TEMP TABLE seen (id uuid, x text);
CREATE FUNCTION pg_temp.mark() RETURNS void LANGUAGE sql AS $$
    DELETE FROM seen;
    INSERT INTO seen SELECT a.id, a.xmin::text FROM runrow.agent_run AS a;
$$;
-- The transaction ids that wrote agent_run rows since mark(): the subtransactions of the call.
CREATE FUNCTION pg_temp.subxids() RETURNS integer LANGUAGE sql AS $$
    SELECT count(DISTINCT a.xmin::text)::integer FROM runrow.agent_run AS a
    WHERE NOT EXISTS (SELECT 1 FROM seen AS s WHERE s.id = a.id AND s.x = a.xmin::text)
$$;

-- 100 due schedules, a new conversation per tick: a pass of the default max_schedules wrote
-- 100 subtransactions.
SELECT runrow.create_schedule('plain-' || i, '*/10 * * * *', '"p"', 'm') FROM generate_series(1, 100) AS i;
UPDATE runrow.schedule SET next_fire_at = '2030-01-01 00:00Z';
SELECT pg_temp.mark();
SELECT is(runrow._fire_schedules('2030-01-01 00:05Z', 100), 64, '100 due schedules: a call fires 64');
SELECT is(pg_temp.subxids(), 64, 'in 64 subtransactions that wrote: the cache holds them all');
SELECT is((SELECT count(*)::integer FROM runrow.schedule WHERE next_fire_at <= '2030-01-01 00:05Z'), 36,
    'the other 36 are left due, untouched');
SELECT pg_temp.mark();
SELECT is(runrow._fire_schedules('2030-01-01 00:05Z', 100), 36, 'the next call fires them');
SELECT is(pg_temp.subxids(), 36, 'in 36');

-- if_active = interrupt: a tick that stops its conversation's run is two subtransactions.
DELETE FROM runrow.schedule;
SELECT runrow.create_schedule('interrupt-' || g.i, '*/10 * * * *', '"i"', 'm', conversation_id => g.c,
    if_active => 'interrupt')
FROM (SELECT i, gen_random_uuid() AS c FROM generate_series(1, 40) AS i) AS g,
    LATERAL runrow.enqueue_run(g.c, '"the turn a tick interrupts"', 'm') AS e;
UPDATE runrow.schedule SET next_fire_at = '2030-01-01 00:00Z';
SELECT pg_temp.mark();
SELECT is(runrow._fire_schedules('2030-01-01 00:05Z', 100), 32, '40 due interrupting schedules: a call fires 32');
SELECT is(pg_temp.subxids(), 64, 'in 64 subtransactions (32 stops, 32 enqueues)');
SELECT is((SELECT count(*)::integer FROM runrow.agent_run WHERE status = 'cancelled'
        AND conversation_id IN (SELECT conversation_id FROM runrow.schedule)), 32, 'each stopped its turn');
SELECT is(runrow._fire_schedules('2030-01-01 00:05Z', 100), 8, 'the next call fires the other 8');

-- One schedule's catch-up: 100 missed ticks are cut at 64; next_fire_at is the oldest not
-- fired, so the next call goes on from it.
DELETE FROM runrow.schedule;
SELECT runrow.create_schedule('minutely', '* * * * *', '"m"', 'm', catch_up => 'each', max_catch_up => 100) AS sched \gset
UPDATE runrow.schedule SET next_fire_at = '2030-01-01 00:00Z';
SELECT pg_temp.mark();
SELECT is(runrow._fire_schedules('2030-01-01 01:39Z', 100), 64, '100 missed ticks: a call fires the oldest 64');
SELECT is((SELECT (next_fire_at, last_tick_at, last_error)::text FROM runrow.schedule WHERE id = :'sched'),
    ('2030-01-01 01:04Z'::timestamptz, '2030-01-01 01:03Z'::timestamptz, NULL::text)::text,
    'next_fire_at is the first tick not fired, last_tick_at the last fired');
SELECT is(runrow._fire_schedules('2030-01-01 01:39Z', 100), 36, 'the next call fires the other 36');
SELECT is((SELECT (next_fire_at, last_tick_at)::text FROM runrow.schedule WHERE id = :'sched'),
    ('2030-01-01 01:40Z'::timestamptz, '2030-01-01 01:39Z'::timestamptz)::text,
    'and moves past the instant: every tick fired once');

SELECT * FROM finish();
ROLLBACK;
