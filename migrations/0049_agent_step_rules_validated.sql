-- depends: 0048_agent_step_rules_in_one_check
-- Validate agent_step_rules (added NOT VALID by 0048) in a transaction of its own: the scan of
-- agent_step runs under SHARE UPDATE EXCLUSIVE, which appends of steps do not wait for. audit()
-- reports the constraint while it is not validated.

ALTER TABLE runrow.agent_step VALIDATE CONSTRAINT agent_step_rules;
