-- runrow.trim_journal purges delivered webhook deliveries: those delivered longer than
-- older_than ago go, at most max_runs a call, the earliest delivered first, read through
-- webhook_delivery_delivered; dead letters (a person may still re-arm them), pending ones and
-- recent deliveries stay. A delivery made after its run's journal was trimmed goes in its turn.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(15);
SELECT pg_temp.drain_queue();

-- An ended run with a webhook: its delivery, due.
CREATE FUNCTION pg_temp.hooked() RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE run uuid;
BEGIN
    SELECT run_id INTO run FROM runrow.enqueue_run(conversation_id => gen_random_uuid(), content => '"hi"',
        model => 'test-model', webhook_url => 'http://trim.example/hook');
    PERFORM runrow.finish_run(run, pg_temp.claim(run), 'completed');
    RETURN (SELECT id FROM runrow.webhook_delivery WHERE run_id = run);
END $$;
-- Lease one delivery and record its outcome: delivered, or dead (a permanent failure).
CREATE FUNCTION pg_temp.outcome(d uuid, delivered boolean) RETURNS void LANGUAGE plpgsql AS $$
DECLARE tok uuid;
BEGIN
    -- Leases every due delivery (an earlier call may have leased this one already).
    PERFORM runrow.claim_webhook_deliveries('pgtap', 1000, 30, 8, 1000);
    SELECT w.claim_token INTO tok FROM runrow.webhook_delivery AS w WHERE w.id = d;
    IF delivered THEN
        PERFORM runrow.complete_webhook_delivery(d, tok, 200);
    ELSE
        PERFORM runrow.fail_webhook_delivery(d, tok, 'HTTP 410', 410, permanent => true);
    END IF;
END $$;
-- As if it had been delivered (or dead-lettered) `ago` ago: a delivered row is final, so the
-- superuser skips the guard for this one write, as pg_temp.age_finished does for runs.
CREATE FUNCTION pg_temp.age_delivery(d uuid, ago interval) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    SET LOCAL session_replication_role = replica;
    UPDATE runrow.webhook_delivery
    SET delivered_at = CASE WHEN state = 'delivered' THEN now() - ago END, updated_at = now() - ago
    WHERE id = d;
    SET LOCAL session_replication_role = origin;
END $$;
CREATE FUNCTION pg_temp.kept(VARIADIC ids uuid[]) RETURNS boolean[] LANGUAGE sql AS $$
    SELECT array_agg(EXISTS (SELECT FROM runrow.webhook_delivery AS w WHERE w.id = i) ORDER BY n)
    FROM unnest(ids) WITH ORDINALITY AS u (i, n)
$$;

SELECT pg_temp.hooked() AS old_ok \gset
SELECT pg_temp.hooked() AS young_ok \gset
SELECT pg_temp.hooked() AS old_dead \gset
SELECT pg_temp.hooked() AS old_pending \gset
SELECT pg_temp.outcome(:'old_ok', true), pg_temp.outcome(:'young_ok', true), pg_temp.outcome(:'old_dead', false);
SELECT pg_temp.age_delivery(:'old_ok', '2 days'), pg_temp.age_delivery(:'young_ok', '1 hour'),
       pg_temp.age_delivery(:'old_dead', '2 days');
SELECT is((SELECT array_agg(state ORDER BY n) FROM unnest(ARRAY[:'old_ok', :'young_ok', :'old_dead', :'old_pending']::uuid[])
               WITH ORDINALITY AS u (i, n) JOIN runrow.webhook_delivery AS w ON w.id = u.i),
    ARRAY['delivered', 'delivered', 'dead', 'pending'], 'four deliveries: delivered two days and an hour ago, dead two days ago, pending');

-- Runs here ended now: their journals stay, and what a trim deletes is the delivery alone.
SET LOCAL enable_seqscan = off;
SELECT pg_stat_get_xact_numscans('runrow.webhook_delivery_delivered'::regclass) AS delivered_scans,
       pg_stat_get_xact_numscans('runrow.webhook_delivery'::regclass) AS table_scans \gset
SELECT is(runrow.trim_journal('1 day'), 1::bigint, 'a trim deletes the delivery delivered two days ago, and counts it');
SELECT is((pg_stat_get_xact_numscans('runrow.webhook_delivery_delivered'::regclass) - :delivered_scans)
    || ' ' || (pg_stat_get_xact_numscans('runrow.webhook_delivery'::regclass) - :table_scans),
    '1 0', 'reading webhook_delivery_delivered, never the whole table');
RESET enable_seqscan;
SELECT is(pg_temp.kept(:'old_ok', :'young_ok', :'old_dead', :'old_pending'), ARRAY[false, true, true, true],
    'the one delivered an hour ago stays, the dead letter stays, the pending one stays');
SELECT is(runrow.retry_webhook_delivery(:'old_dead'), true, 'a person may still re-arm the old dead letter');
SELECT is((SELECT count(*)::int FROM runrow.agent_run AS a WHERE a.webhook_url = 'http://trim.example/hook'), 4,
    'every run stays, the purged delivery''s too');
SELECT pg_temp.fingerprint() AS before \gset
SELECT is(runrow.trim_journal('1 day'), 0::bigint, 'a second trim finds nothing');
SELECT is(pg_temp.fingerprint(), :'before', 'and writes nothing');
SELECT is(runrow.trim_journal('2 hours'), 0::bigint, 'older_than 2 hours keeps the one delivered an hour ago');

-- A delivery made after its run's journal was trimmed: the run is not looked at again, the
-- delivery goes by when it was delivered.
SELECT pg_temp.hooked() AS late \gset
SELECT run_id AS late_run FROM runrow.webhook_delivery WHERE id = :'late' \gset
SELECT pg_temp.age_finished(:'late_run', '3 days');
SELECT ok(runrow.trim_journal('1 day') > 0, 'the run ended three days ago loses its journal');
SELECT is(pg_temp.kept(:'late'), ARRAY[true], 'its delivery, not delivered yet, stays');
SELECT pg_temp.outcome(:'late', true);
SELECT pg_temp.age_delivery(:'late', '25 hours');
SELECT is(runrow.trim_journal('1 day'), 1::bigint, 'once delivered over a day ago, a later trim deletes it');

-- A backlog goes in bounded calls, the earliest delivered first.
SELECT pg_temp.hooked() AS b1 \gset
SELECT pg_temp.hooked() AS b2 \gset
SELECT pg_temp.hooked() AS b3 \gset
SELECT pg_temp.outcome(:'b1', true), pg_temp.outcome(:'b2', true), pg_temp.outcome(:'b3', true);
SELECT pg_temp.age_delivery(:'b1', '4 days'), pg_temp.age_delivery(:'b2', '2 days'), pg_temp.age_delivery(:'b3', '3 days');
SELECT is(runrow.trim_journal('1 day', max_runs => 2), 2::bigint, 'max_runs 2: two deliveries');
SELECT is(pg_temp.kept(:'b1', :'b3', :'b2'), ARRAY[false, false, true], 'the two delivered earliest');
SELECT is(runrow.trim_journal('1 day', max_runs => 2), 1::bigint, 'the next call takes the third');

SELECT * FROM finish();
ROLLBACK;
