-- runrow.schema_version: the newest applied migration id, from the yoyo bookkeeping
-- that `runrow migrate` and sql/install.sql both keep; NULL when nothing is installed.
-- Run from the repository root (scripts/pgtap.sh does): it compares with migrations/.
BEGIN;
\ir helpers/setup.psql
SELECT plan(12);

SELECT has_function('runrow', 'schema_version', ARRAY[]::name[], 'schema_version() exists');
SELECT function_returns('runrow', 'schema_version', ARRAY[]::name[], 'text', 'and returns text');
SELECT is_definer('runrow', 'schema_version', ARRAY[]::name[], 'schema_version is SECURITY DEFINER');
SELECT function_privs_are('runrow', 'schema_version', ARRAY[]::name[], 'runrow_worker', ARRAY['EXECUTE'],
    'runrow_worker may read it');
SELECT function_privs_are('runrow', 'schema_version', ARRAY[]::name[], 'runrow_client', ARRAY['EXECUTE'],
    'runrow_client may read it');
SELECT function_privs_are('runrow', 'schema_version', ARRAY[]::name[], 'runrow_auditor', ARRAY['EXECUTE'],
    'runrow_auditor may read it');
SELECT function_privs_are('runrow', 'schema_version', ARRAY[]::name[], 'public', ARRAY[]::name[],
    'PUBLIC may not');

-- The newest migration file in the tree, without .sql, is what a migrated database reports.
\set newest `ls migrations/*.sql | grep -v '[.]rollback[.]sql$' | sort | tail -n 1 | xargs -n 1 basename | sed 's/[.]sql$//'`
SELECT is(runrow.schema_version(), :'newest', 'it is the newest migration in migrations/');

-- Through a role that cannot read the bookkeeping table itself: SECURITY DEFINER does.
SET LOCAL ROLE runrow_client;
SELECT is(runrow.schema_version(), :'newest', 'a client reads the same version');
RESET ROLE;

-- It is the greatest id, not the most recently applied row.
INSERT INTO runrow._yoyo_migration (migration_hash, migration_id, applied_at_utc)
VALUES (md5('pgtap-future'), '9999_pgtap_future', now() AT TIME ZONE 'UTC' - interval '1 day');
SELECT is(runrow.schema_version(), '9999_pgtap_future', 'the greatest migration id wins, whenever applied');
INSERT INTO runrow._yoyo_migration (migration_hash, migration_id, applied_at_utc)
VALUES (md5('pgtap-past'), '0000_pgtap_past', now() AT TIME ZONE 'UTC' + interval '1 day');
SELECT is(runrow.schema_version(), '9999_pgtap_future', 'a later-applied but older id does not');

DELETE FROM runrow._yoyo_migration;
SELECT is(runrow.schema_version(), NULL, 'NULL when no migration is recorded');

SELECT * FROM finish();
ROLLBACK;
