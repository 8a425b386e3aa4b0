-- depends: 0056_message_rules_in_one_check
-- Validate message_rules (added NOT VALID by 0056) in a transaction of its own: the scan of
-- message runs under SHARE UPDATE EXCLUSIVE, which enqueues do not wait for. audit() reports
-- the constraint while it is not validated.

ALTER TABLE runrow.message VALIDATE CONSTRAINT message_rules;
