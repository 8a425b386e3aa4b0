CREATE OR REPLACE FUNCTION runrow.schema_version()
RETURNS text
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
    SELECT max(m.migration_id)::text FROM runrow._yoyo_migration AS m;
$fn$;

COMMENT ON FUNCTION runrow.schema_version() IS
'The id of the newest applied migration (for example 0001_core), read from the yoyo '
'bookkeeping that runrow migrate and sql/install.sql both keep. NULL means not installed. '
'Clients compare it with the version they were built against.';

REVOKE ALL ON FUNCTION runrow.schema_version() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.schema_version() TO runrow_worker, runrow_client, runrow_auditor;
