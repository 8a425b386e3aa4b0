-- depends: 0045_agent_run_state_rules_in_one_check
-- Validate agent_run_state (added NOT VALID by 0045) in a transaction of its own: the scan of
-- agent_run runs under SHARE UPDATE EXCLUSIVE, which claims, heartbeats and endings do not
-- wait for. audit() reports the constraint while it is not validated.

ALTER TABLE runrow.agent_run VALIDATE CONSTRAINT agent_run_state;
