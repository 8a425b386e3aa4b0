-- depends: 0079_schedules_fair_passes
-- A model call whose worker dies mid-stream (SIGKILL, a lost host) was billed by the API and
-- never paid for: the usage is settled by append_step or record_usage, which the dead worker
-- never calls, and the reaper that ends its claim charged nothing. The resumed attempt calls
-- the model again, so each kill was an unpaid response, and a run or tenant under a
-- token_budget or cost_budget could overspend by as much as the kills allowed.
--
-- acquire_model_call now reserves each call it grants: the worst case the database can know
-- (the worker's input estimate as input tokens, the run's max_tokens as output tokens), kept
-- on the run with the attempt it belongs to. append_step and record_usage clear it when they
-- settle the real usage; defer_run drops it (its call was refused). reap_expired_runs charges
-- a reservation of the attempt it reaps to the run, the tenant's hour and the budgets, as a
-- usage, once: the reaped holder's later settle is fenced out. A reservation of an earlier
-- attempt (its holder handed the run back alive) is never charged.
--
-- At the end of the row, after the columns a claim, a heartbeat and a finish change (0029):
-- none of those writes them, so they sit in the common suffix those updates do not log.

ALTER TABLE runrow.agent_run
ADD COLUMN model_call_reserved jsonb,
ADD COLUMN model_call_attempt integer;

COMMENT ON COLUMN runrow.agent_run.model_call_reserved IS
'The usage charged for the run''s granted, unsettled model call if its holder dies: '
'{input_tokens: the worker''s estimate, output_tokens: the run''s max_tokens (default 4096)}, '
'set by acquire_model_call, cleared when append_step or record_usage settles the real usage, '
'by defer_run, and when reap_expired_runs charges it.';
COMMENT ON COLUMN runrow.agent_run.model_call_attempt IS
'The attempt whose grant model_call_reserved is: only a reap of that attempt charges it.';

-- 0073: a column is the auditor's only when granted.
GRANT SELECT (model_call_reserved, model_call_attempt) ON runrow.agent_run TO runrow_auditor;
