-- depends: 0088_tenant_reserved
-- update_tenant_budget (functions/update_tenant_budget.sql): `runrow budget tenant acme
-- --cost-per-day 30` keeps acme's tokens_per_day. The CLI read the tenant's row and then called
-- set_tenant_budget with both values, so a change of tokens_per_day committed between the two
-- was overwritten with the value read. The new function takes NULL as "keep" and applies the
-- change in one statement under the row's lock. This migration is the version that says the
-- function is there (`runrow migrate` applies functions/ after it).

COMMENT ON SCHEMA runrow IS
'runrow: durable AI-agent runs (migrations and functions/ of the runrow package; '
'runrow.schema_version() names the newest migration applied).';
