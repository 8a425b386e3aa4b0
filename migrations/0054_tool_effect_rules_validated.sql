-- depends: 0053_tool_effect_rules_in_one_check
-- Validate tool_effect_rules (added NOT VALID by 0053) in a transaction of its own: the scan of
-- tool_effect runs under SHARE UPDATE EXCLUSIVE, which tool calls do not wait for. audit()
-- reports the constraint while it is not validated.

ALTER TABLE runrow.tool_effect VALIDATE CONSTRAINT tool_effect_rules;
