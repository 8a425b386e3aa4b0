-- runrow._next_webhook_receiver: the first receiver after a given one (text order) that has a
-- pending delivery, the step of claim_webhook_deliveries' walk over receivers; delivered and
-- dead deliveries do not count, and NULL follows the last.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
SELECT plan(4);
SELECT pg_temp.drain_queue();

CREATE FUNCTION pg_temp.hooked(url text) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE run uuid;
BEGIN
    SELECT run_id INTO run FROM runrow.enqueue_run(conversation_id => gen_random_uuid(), content => '"hi"',
        model => 'test-model', webhook_url => url);
    PERFORM runrow.finish_run(run, pg_temp.claim(run), 'completed');
    RETURN (SELECT id FROM runrow.webhook_delivery WHERE run_id = run);
END $$;

SELECT pg_temp.hooked('http://zz-next-b.example/x');
SELECT pg_temp.hooked('http://ZZ-next-a.example:80/y');
SELECT pg_temp.hooked('https://zz-next-c.example/z') AS c \gset

SELECT is(runrow._next_webhook_receiver('http://zz-next-'), 'http://zz-next-a.example:80',
    'the first receiver after a prefix, case-folded, the port filled in');
SELECT is(runrow._next_webhook_receiver('http://zz-next-a.example:80'), 'http://zz-next-b.example:80',
    'then the next');
SELECT is(runrow._next_webhook_receiver('http://zz-next-b.example:80'), 'https://zz-next-c.example:443',
    'then the next, across schemes');
UPDATE runrow.webhook_delivery SET state = 'dead', last_error = 'test' WHERE id = :'c';
SELECT is(runrow._next_webhook_receiver('http://zz-next-b.example:80'), NULL,
    'a receiver whose only delivery is dead is not walked; NULL after the last');

SELECT * FROM finish();
ROLLBACK;
