-- depends: 0077_queue_metrics_key_errors
-- Schedules: what an audit of the firing passes found.
--
-- - A schedule a pass left due because it was busy (its conversation locked by another session,
--   its if_active = interrupt stop timed out) counted toward the pass's max_schedules, and every
--   pass took the due schedules oldest first, so the same busy ones came first every time: with
--   100 busy due schedules (the default max_schedules) no other schedule of the fleet ever fired.
--   A pass now counts only the schedules it moves on (fired, or failed for good), looks at no
--   more than 10 x max_schedules due schedules, and stamps each one it leaves due with
--   passed_over_at: the pass's instant, after every tick due then, so the next passes take the
--   schedules due before it first and a busy one waits its turn behind them
--   (functions/_schedule_helpers.sql, _fire_schedules).
-- A column without a default is added without a rewrite; the index is on a table of one row
-- per schedule.

ALTER TABLE runrow.schedule
ADD COLUMN passed_over_at timestamptz;

COMMENT ON COLUMN runrow.schedule.passed_over_at IS
'The instant of the last firing pass that left this schedule due because it was busy (its '
'conversation locked, its interrupt timed out); NULL once a pass moves it on. Passes take '
'due schedules in the order of greatest(next_fire_at, passed_over_at), so a busy schedule '
'goes behind every schedule that was due when it was passed over.';

-- The firing order, and what a pass reads: its cost is the schedules it looks at.
CREATE INDEX schedule_fire_order ON runrow.schedule ((greatest(next_fire_at, passed_over_at)), next_fire_at);
