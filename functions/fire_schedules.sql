CREATE OR REPLACE FUNCTION runrow.fire_schedules(max_schedules integer DEFAULT 100)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    PERFORM runrow._require_range(fire_schedules.max_schedules, 'max_schedules', 1, 10000);
    RETURN runrow._fire_schedules(now(), fire_schedules.max_schedules);
END
$fn$;

COMMENT ON FUNCTION runrow.fire_schedules(integer) IS
'Fire every schedule whose next tick is due by the database clock (now()), up to max_schedules '
'of them (the oldest due first; the next pass takes the rest). Called by every worker''s '
'reaper pass, no singleton: each schedule is fired under its row lock taken FOR UPDATE SKIP '
'LOCKED (a pass never waits for another) and its next_fire_at advances in the same '
'transaction, and each tick''s run carries an idempotency key of schedule and tick, so a tick '
'enqueues exactly once whichever workers fire it. A schedule that is busy (its tick''s '
'conversation locked by another session, its if_active = interrupt stop timed out) is left due '
'with last_error saying so; it does not count toward max_schedules and goes behind every '
'schedule due now (passed_over_at), so busy schedules never take the others'' turn. A call '
'reads at most 10 x max_schedules due schedules, however many are busy, and enqueues at most 64 '
'ticks (a tick of an if_active = interrupt schedule counts two): each is a subtransaction, and '
'64 is what a backend''s subxid cache holds before every snapshot in the cluster pays for it; '
'the next call takes the rest. Missed ticks follow '
'the schedule''s catch_up (latest: only the most recent; each: every one, at most max_catch_up '
'of the most recent). A tick whose template cannot be enqueued (the fixed conversation belongs '
'to another user, has an active run and if_active = reject, ...) is skipped for good and its '
'error kept in runrow.schedules.last_error. Returns the number of runs created. max_schedules '
'outside 1 to 10000 raises 22023, NULL 22004; nothing is written.';

REVOKE ALL ON FUNCTION runrow.fire_schedules(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.fire_schedules(integer) TO runrow_worker;
