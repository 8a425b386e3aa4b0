-- depends: 0083_webhook_pending_by_receiver
-- A run told to wait for its key's block (acquire_model_call answered blocked, report_key_error
-- blocked the key) and deferred with that wait (defer_run) after the block was lifted early (the
-- key error's probe answered, set_rate_limit removed the limit) found no block in force, so it
-- waited its whole retry_in, up to key_error_max_block (300 s), with the key working: the lift
-- (_lift_held_runs) had run before the run was queued. The worker hands the outcome back to its
-- supervisor before it defers, so the window is a round trip or more, and CI met it
-- (test_key_errors::test_deferred_runs_go_as_soon_as_the_key_works: the last run 6.2 s after
-- the block, one whole block late).
--
-- The run now keeps the block's end it was told; defer_run compares it with the key's block:
-- a block that now ends earlier than the one told (or is gone) has been lifted, and the
-- deferral ends when the block does. At the end of the row with the model-call columns (0080):
-- a claim, a heartbeat and a finish never write it.

ALTER TABLE runrow.agent_run
ADD COLUMN block_told_until timestamptz;

COMMENT ON COLUMN runrow.agent_run.block_told_until IS
'The end of the rate_limit_key block its holder was last told to wait for (acquire_model_call '
'answered blocked, report_key_error blocked the key), cleared by a grant and by defer_run: a '
'deferral for a block lifted since ends with the block, not retry_in later.';

-- 0073: a column is the auditor's only when granted.
GRANT SELECT (block_told_until) ON runrow.agent_run TO runrow_auditor;
