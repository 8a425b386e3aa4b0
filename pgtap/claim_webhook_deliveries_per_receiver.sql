-- claim_webhook_deliveries' max_per_receiver: no delivery is leased whose receiver
-- (scheme://host:port, case-folded: _webhook_receiver) already has that many unexpired leases,
-- however many claims ask; a lapsed lease, a delivery and a failure each free a place; the
-- deliveries held back at the head of the queue wait in place while a claim reads on past them,
-- so the ones behind them are reached, and one claim reads a bounded number of them.
-- Claims at the same moment in two sessions: tests/test_webhook_races.py.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(38);
SELECT pg_temp.drain_queue();
-- Deliveries left by other files' data must not be claimed here.
UPDATE runrow.webhook_delivery SET state = 'dead', claim_token = NULL, claim_expires_at = NULL
WHERE state = 'pending';

-- n runs to `url`, ended: n deliveries due at now() - `ago`.
CREATE FUNCTION pg_temp.ended(url text, n int, ago interval DEFAULT '1 minute') RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM runrow.enqueue_run(conversation_id => gen_random_uuid(), content => '"hi"', model => 'test-model',
        webhook_url => url) FROM generate_series(1, n);
    FOR i IN 0 .. (n - 1) / 1000 LOOP  -- claim_runs takes at most 1000 a call
        PERFORM runrow.finish_run(c.run_id, c.claim_token, 'completed')
        FROM runrow.claim_runs('pgtap', least(1000, n - i * 1000), 60) AS c;
    END LOOP;
    UPDATE runrow.webhook_delivery AS w SET next_attempt_at = now() - ago
    WHERE w.url = ended.url AND w.state = 'pending' AND w.claim_token IS NULL;
END $$;
-- The deliveries a claim leased, by receiver: 'receiver x count, ...'.
CREATE FUNCTION pg_temp.by_receiver(claim text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE got text;
BEGIN
    EXECUTE format('SELECT coalesce(string_agg(r || '' x '' || n, '', '' ORDER BY r COLLATE "C"), '''')
        FROM (SELECT runrow._webhook_receiver(c.url) AS r, count(*) AS n FROM (%s) AS c GROUP BY 1) AS x', claim)
    INTO got;
    RETURN got;
END $$;
CREATE FUNCTION pg_temp.leases(receiver text) RETURNS int LANGUAGE sql AS $$
    SELECT count(*)::int FROM runrow.webhook_delivery AS w
    WHERE runrow._webhook_receiver(w.url) = receiver AND w.claim_token IS NOT NULL AND w.claim_expires_at > now()
$$;
CREATE FUNCTION pg_temp.outbox() RETURNS text LANGUAGE sql AS $$
    SELECT md5(coalesce(string_agg(w.ctid::text || to_jsonb(w)::text, ',' ORDER BY w.id), ''))
    FROM runrow.webhook_delivery AS w
$$;

-- The signature and grants: webhook_outbox.sql. The four-argument form is replaced, not kept as
-- an overload beside the new one (a four-argument call would be ambiguous).
SELECT hasnt_function('runrow', 'claim_webhook_deliveries', '{text,integer,integer,integer}'::name[],
    'the four-argument form is gone');
SELECT ok(obj_description('runrow.claim_webhook_deliveries(text, integer, integer, integer, integer)'::regprocedure,
    'pg_proc') ~ 'max_per_receiver', 'its COMMENT states max_per_receiver');

-- The receiver: scheme, host and port, case-folded, the default port filled in.
SELECT is(runrow._webhook_receiver(u), r, format('%s is receiver %s', u, r)) FROM (VALUES
    ('http://Hooks.Example/a?b#c', 'http://hooks.example:80'),
    ('http://hooks.example:80/other/path', 'http://hooks.example:80'),
    ('https://hooks.example', 'https://hooks.example:443'),
    ('https://user:secret@hooks.example.:8443/x', 'https://hooks.example:8443'),
    ('http://[::1]:8080/x', 'http://[::1]:8080'),
    ('http://[2001:DB8::1]/x', 'http://[2001:db8::1]:80'),
    ('http://hooks.example:/x', 'http://hooks.example:80'),
    ('http://hooks.example:0080?x', 'http://hooks.example:80')
) AS v (u, r);
SELECT is(runrow._webhook_receiver('http://a b:c:d@@'), 'http://:80', 'a URL outside the grammar still gets one, no error');
SELECT is(runrow._webhook_receiver(NULL), NULL, 'NULL for NULL');

-- The cap, over every claim: 6 deliveries to one receiver (two spellings of it), 2 to its https
-- twin and 1 to another port: three receivers.
SELECT pg_temp.ended('http://A.example:80/one', 3);
SELECT pg_temp.ended('http://a.example/two', 3);
SELECT pg_temp.ended('https://a.example/', 2);
SELECT pg_temp.ended('http://a.example:8080/', 1);
-- The first claims of this session, planned here: scans priced out as in trim_journal.sql, so
-- what is shown is that every lease count has a path through the index of leases.
SET LOCAL enable_seqscan = off;
SELECT pg_stat_get_xact_numscans('runrow.webhook_delivery_leased'::regclass) AS leased_scans,
       pg_stat_get_xact_numscans('runrow.webhook_delivery'::regclass) AS table_scans \gset
SELECT is(pg_temp.by_receiver($$SELECT * FROM runrow.claim_webhook_deliveries('w1', 10, 30, 3)$$),
    'http://a.example:80 x 4, http://a.example:8080 x 1, https://a.example:443 x 2',
    'called by position with four arguments, the default cap: 4 of the 6 to one receiver, and every other''s');
SELECT is((pg_stat_get_xact_numscans('runrow.webhook_delivery_leased'::regclass) - :leased_scans)
    || ' ' || (pg_stat_get_xact_numscans('runrow.webhook_delivery'::regclass) - :table_scans),
    '3 0', 'each receiver''s leases counted through webhook_delivery_leased, the table never scanned');
RESET enable_seqscan;
SELECT is_empty($$SELECT * FROM runrow.claim_webhook_deliveries(worker_id => 'w2', max_attempts => 3)$$,
    'called by name without max_per_receiver, another worker''s claim gets none: the cap counts every worker''s leases');
SELECT is(pg_temp.by_receiver($$SELECT * FROM runrow.claim_webhook_deliveries('w2', 10, 30, 3, max_per_receiver => 5)$$),
    'http://a.example:80 x 1', 'a cap of 5 takes one more');
SELECT is(pg_temp.leases('http://a.example:80'), 5, 'five in flight');

-- Each ending frees a place: a delivery, a failure, a lapsed lease.
SELECT (SELECT id FROM runrow.webhook_delivery WHERE claim_token IS NOT NULL AND url LIKE 'http://a.example/two' LIMIT 1) AS d1 \gset
SELECT ok(runrow.complete_webhook_delivery(:'d1', (SELECT claim_token FROM runrow.webhook_delivery WHERE id = :'d1'), 200),
    'one is delivered');
SELECT is(pg_temp.by_receiver($$SELECT * FROM runrow.claim_webhook_deliveries('w2', 10, 30, 3, max_per_receiver => 5)$$),
    'http://a.example:80 x 1', 'its place goes to the sixth');
SELECT is_empty($$SELECT * FROM runrow.claim_webhook_deliveries('w2', 10, 30, 3, max_per_receiver => 5)$$,
    'none is left due');
SELECT pg_temp.ended('http://a.example/three', 2);
SELECT (SELECT id FROM runrow.webhook_delivery WHERE claim_token IS NOT NULL AND url = 'http://A.example:80/one' LIMIT 1) AS d2 \gset
SELECT is(runrow.fail_webhook_delivery(:'d2', (SELECT claim_token FROM runrow.webhook_delivery WHERE id = :'d2'), 'HTTP 500', 500),
    'retrying', 'one fails');
SELECT is(pg_temp.by_receiver($$SELECT * FROM runrow.claim_webhook_deliveries('w2', 10, 30, 3, max_per_receiver => 5)$$),
    'http://a.example:80 x 1', 'its place goes to the next');
SELECT (SELECT id FROM runrow.webhook_delivery WHERE claim_token IS NOT NULL AND url = 'http://A.example:80/one' LIMIT 1) AS d3 \gset
UPDATE runrow.webhook_delivery SET claim_expires_at = now() - interval '1 second', next_attempt_at = now() - interval '1 second'
WHERE id = :'d3';
SELECT is(pg_temp.leases('http://a.example:80'), 4, 'a lapsed lease is in flight no more');
SELECT is(pg_temp.by_receiver($$SELECT * FROM runrow.claim_webhook_deliveries('w2', 10, 30, 3, max_per_receiver => 5)$$),
    'http://a.example:80 x 1', 'and its place goes to the next due (the lapsed one waits its turn)');
SELECT is(pg_temp.leases('http://a.example:80'), 5, 'five in flight again');

-- The head of the queue held back: 1,200 due to one receiver (capped at 1), then one to
-- another. A claim reads on from where each sweep stopped (max_deliveries + 100, doubling: 101,
-- 202, 404, 808 here) and reaches the other receiver's, writing nothing to the ones it passed
-- over: they stay due, in their place (stop 57's first version moved them to the receiver's
-- lease end, and a healthy receiver with a backlog drained 4 a lease).
SELECT pg_temp.ended('http://crowded.example/hook', 1200, '2 minutes');
SELECT pg_temp.ended('http://late.example/hook', 1, '1 minute');
SELECT is(pg_temp.by_receiver($$SELECT * FROM runrow.claim_webhook_deliveries('w3', 1, 60, 3, max_per_receiver => 1)$$),
    'http://crowded.example:80 x 1', 'the first claim takes the crowded receiver''s one place');
SELECT is(pg_temp.by_receiver($$SELECT * FROM runrow.claim_webhook_deliveries('w3', 1, 60, 3, max_per_receiver => 1)$$),
    'http://late.example:80 x 1', 'the next reads on past the 1,199 held back and reaches the other receiver''s');
SELECT is((SELECT count(*)::int FROM runrow.webhook_delivery
           WHERE url = 'http://crowded.example/hook' AND claim_token IS NULL AND next_attempt_at <= now()
             AND next_attempt_at >= now() - interval '2 minutes'), 1199,
    'the ones held back are all still due, where they were');
SELECT is((SELECT count(*)::int FROM runrow.webhook_delivery
           WHERE url = 'http://crowded.example/hook' AND claim_token IS NOT NULL), 1, 'still one in flight to the crowded one');
SELECT is((SELECT count(*)::int FROM runrow.webhook_delivery WHERE url = 'http://crowded.example/hook' AND attempts > 0), 1,
    'and passing over them spent no attempt');
-- Past max_read (10,000 due deliveries read in one claim) the claim walks the receivers instead:
-- 10,100 due to a receiver that takes none (its one place taken), then one to another. Reading in
-- due order alone, the other waited until the 10,100 drained (hours to days behind a receiver
-- that never answers: the review of stop 57).
SELECT pg_temp.ended('http://hanging.example/hook', 10100, '3 minutes');
SELECT pg_temp.ended('http://behind.example/hook', 1, '1 minute');
SELECT is(pg_temp.by_receiver($$SELECT * FROM runrow.claim_webhook_deliveries('w4', 1, 60, 3, max_per_receiver => 1)$$),
    'http://hanging.example:80 x 1', 'the hanging receiver''s one place');
SELECT is(pg_temp.by_receiver($$SELECT * FROM runrow.claim_webhook_deliveries('w4', 1, 60, 3, max_per_receiver => 1)$$),
    'http://behind.example:80 x 1', 'the next claim reaches the receiver behind 10,099 held back, by the walk');
UPDATE runrow.webhook_delivery SET state = 'dead', last_error = 'test over'
WHERE url = 'http://hanging.example/hook' AND state = 'pending' AND claim_token IS NULL;

-- Fewer due than one sweep reads: nothing is put back, whatever the cap held.
SELECT pg_temp.outbox() AS before \gset
SELECT is_empty($$SELECT * FROM runrow.claim_webhook_deliveries('w3', 100, 60, 3, max_per_receiver => 1)$$,
    'a claim that reads every due delivery and may take none of them');
SELECT is(pg_temp.outbox(), :'before', 'writes nothing');

-- Bad input: named, nothing written.
SELECT throws_ok($$SELECT * FROM runrow.claim_webhook_deliveries('w', 1, 30, 8, 0)$$, '22023',
    'max_per_receiver must be between 1 and 1000, got 0', 'max_per_receiver 0');
SELECT throws_ok($$SELECT * FROM runrow.claim_webhook_deliveries('w', 1, 30, 8, 1001)$$, '22023',
    'max_per_receiver must be between 1 and 1000, got 1001', 'max_per_receiver 1001');
SELECT throws_ok($$SELECT * FROM runrow.claim_webhook_deliveries('w', 1, 30, 8, NULL)$$, '22004',
    'max_per_receiver must not be NULL', 'max_per_receiver NULL');
SELECT is(pg_temp.outbox(), :'before', 'bad input wrote nothing');

SELECT * FROM finish();
ROLLBACK;
