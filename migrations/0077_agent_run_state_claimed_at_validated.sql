-- Validate agent_run_state (replaced NOT VALID by 0076, with the rule that a running run has
-- its claimed_at) in a transaction of its own: the scan of agent_run runs under SHARE UPDATE
-- EXCLUSIVE, which claims, heartbeats and endings do not wait for (as 0046). audit() reports
-- the constraint while it is not validated.

ALTER TABLE runrow.agent_run VALIDATE CONSTRAINT agent_run_state;
