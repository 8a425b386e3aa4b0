-- fire_schedules' pass, counted: the reaper goes again at once while a pass used its whole
-- budget. fire_schedules' count of runs created could not say so: a pass that moved on 100
-- schedules whose ticks enqueued nothing (if_active = reject on a busy conversation, a template
-- that fails) returned 0, like a pass that found nothing due (migration 0100).
CREATE OR REPLACE FUNCTION runrow.fire_schedules_pass(max_schedules integer DEFAULT 100)
RETURNS TABLE (enqueued integer, moved_on integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    PERFORM runrow._require_range(fire_schedules_pass.max_schedules, 'max_schedules', 1, 10000);
    RETURN QUERY SELECT p.enqueued, p.moved_on
    FROM runrow._fire_schedules_pass(now(), fire_schedules_pass.max_schedules) AS p;
END
$fn$;

COMMENT ON FUNCTION runrow.fire_schedules_pass(integer) IS
'fire_schedules, reporting what the pass did: one row of enqueued, the runs created (what '
'fire_schedules returns), and moved_on, the schedules the pass moved on to their next tick '
'(fired, or their ticks skipped for good because the template could not be enqueued: '
'if_active = reject on a conversation with an active run, a conversation of another user; or '
'stopped for a cron that does not parse). A schedule left due because it was busy is not '
'counted. A pass that moved on max_schedules, or that enqueued anything (it may have stopped at '
'its 64 subtransactions), may have left due schedules behind: the caller calls again, in a '
'transaction of its own; a pass with moved_on < max_schedules and enqueued = 0 left nothing '
'it could fire now. Same guarantees as fire_schedules (row locks FOR UPDATE SKIP LOCKED, a tick '
'enqueues exactly once, never waits on another session). max_schedules outside 1 to 10000 '
'raises 22023, NULL 22004; nothing is written.';

REVOKE ALL ON FUNCTION runrow.fire_schedules_pass(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.fire_schedules_pass(integer) TO runrow_worker;
