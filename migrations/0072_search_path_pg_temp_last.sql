-- Every function that pins its search_path names pg_temp last. Left out, pg_temp is searched
-- first for tables and types: a caller's `CREATE TEMP TABLE text (...)` shadowed pg_catalog's
-- text inside a SECURITY DEFINER function, and a cast the caller defined to that type ran the
-- caller's code as the schema owner (the security audit: a login holding only runrow_worker
-- made itself CREATEROLE through append_events; one holding only runrow_client read every
-- claim token and message through enqueue_run). PostgreSQL's own advice ("Writing SECURITY
-- DEFINER Functions Safely"). The functions/ files say so themselves; these trigger functions
-- are defined by migrations alone.
-- (A DO block: sqlfluff cannot parse a list after ALTER FUNCTION ... SET.)
DO $do$
DECLARE
    fn text;
BEGIN
    FOREACH fn IN ARRAY ARRAY[
        '_agent_run_no_delete', '_no_truncate', '_message_guard', '_conversation_immutable',
        '_prompt_immutable', '_run_event_delete_guard', '_webhook_delivery_guard'
    ] LOOP
        EXECUTE format('ALTER FUNCTION runrow.%I() SET search_path = pg_catalog, runrow, pg_temp', fn);
    END LOOP;
END
$do$;
