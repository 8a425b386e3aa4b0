-- runrow_auditor (dashboards, DBAs) read every column of agent_run and webhook_delivery, their
-- claim tokens among them. A claim token is the capability that fences a run's or a delivery's
-- lease: whoever holds it alongside runrow_worker can heartbeat, journal into and end a run it
-- never claimed, and a login granted the auditor for a dashboard should not hand that out. The
-- auditor keeps SELECT on every other column, granted column by column; the views and
-- runrow.audit() it reads run as their owner and still see the tokens (audit() reports whether
-- one is set, never its value: functions/audit.sql). A column a later migration adds to either
-- table is not the auditor's until that migration grants it: secret by default.
-- Self-contained (the columns are read from the catalog, not listed), so that it applies after
-- a migration that adds a column, whatever number either ends up with.
DO $do$
DECLARE
    t record;
    columns text;
BEGIN
    FOR t IN
        SELECT v.tab, v.secret
        FROM (VALUES ('agent_run', ARRAY['claim_token']),
                     ('webhook_delivery', ARRAY['claim_token'])) AS v (tab, secret)
    LOOP
        SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO columns
        FROM pg_catalog.pg_attribute AS a
        WHERE a.attrelid = format('runrow.%I', t.tab)::regclass
          AND a.attnum > 0 AND NOT a.attisdropped AND a.attname <> ALL (t.secret);
        -- Revoking the table's SELECT also revokes any column grants: the list below is all there is.
        EXECUTE format('REVOKE SELECT ON runrow.%I FROM runrow_auditor', t.tab);
        EXECUTE format('GRANT SELECT (%s) ON runrow.%I TO runrow_auditor', columns, t.tab);
    END LOOP;
END
$do$;
