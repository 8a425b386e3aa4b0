-- depends: 0099_key_error_refused
-- The reaper's fire_once called fire_schedules while a pass enqueued a run, and stopped at a
-- pass that returned 0. A pass that moved on 100 schedules (its max_schedules) whose ticks
-- enqueued nothing (if_active = reject schedules whose conversation has an active run,
-- templates that fail) also returned 0, so the due schedules behind them waited a whole reaper
-- interval (15 s x 0.5-1.5) per 100 such schedules: with about 300 of them a `* * * * *`
-- schedule with catch_up latest lost ticks. functions/fire_schedules_pass.sql (new, for the
-- workers) returns the runs created and the schedules moved on, and the reaper goes again while
-- a pass used its whole budget; fire_schedules keeps its contract (functions/
-- _schedule_helpers.sql: the body is _fire_schedules_pass, _fire_schedules wraps it). This
-- migration is the version that says so (`runrow migrate` applies functions/ after it, and
-- creates the new functions there): a worker that calls fire_schedules_pass refuses an older
-- database.

COMMENT ON SCHEMA runrow IS
'runrow: durable AI-agent runs (migrations and functions/ of the runrow package; '
'runrow.schema_version() names the newest migration applied).';
