-- depends: 0092_pace_shown_reservations_dropped
-- update_rate_limit (functions/update_rate_limit.sql): `runrow limits set KEY --rpm 80` keeps
-- KEY's token limits. The CLI read the key's limits from the rate_limits view and then called
-- set_rate_limit with all three, so a change of another limit committed between the two was
-- overwritten with the value read. The new function takes NULL as "keep" and reads and writes
-- under the key's row lock, as update_tenant_budget does for `runrow budget tenant` (0089).
-- This migration is the version that says the function is there (`runrow migrate` applies
-- functions/ after it).

COMMENT ON SCHEMA runrow IS
'runrow: durable AI-agent runs (migrations and functions/ of the runrow package; '
'runrow.schema_version() names the newest migration applied).';
