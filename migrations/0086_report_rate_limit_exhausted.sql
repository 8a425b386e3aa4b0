-- depends: 0085_identifiers_printable
-- report_rate_limit_exhausted (functions/report_rate_limit_exhausted.sql, with _block_key in
-- functions/_limits_helpers.sql) came with no migration, so schema_version() stayed at 0085 and
-- a worker that calls it passed its start-up check (the newest migration it needs) on a
-- database migrated one commit before the function existed: the first response saying its
-- requests bucket was empty failed the run with 42883, unpaid (the review). This migration is
-- the version that says the function is there: a worker needs it, and `runrow migrate`
-- applies functions/ after it.

COMMENT ON SCHEMA runrow IS
'runrow: durable AI-agent runs (migrations and functions/ of the runrow package; '
'runrow.schema_version() names the newest migration applied).';
