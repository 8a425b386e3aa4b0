-- Identifiers hold no control character (functions/_identifier_checks.sql, migration 0085): every
-- function that takes one refuses a line break (a forged log line), a right-to-left override (a
-- tenant shown as another) and a C1 control (U+0085, NEL) with 22023 naming the argument, and
-- writes nothing; ordinary names (spaces, dots, slashes, colons, non-ASCII letters) still pass;
-- the tables refuse them too, and a row stored before the rule is still updated and claimed.
BEGIN;
\ir helpers/setup.psql
SELECT plan(163);

-- Every table these functions write, as one digest: a refusal leaves it as it was.
CREATE FUNCTION pg_temp.everything() RETURNS text LANGUAGE sql AS $$
    SELECT md5(concat_ws('|', pg_temp.fingerprint(),
        (SELECT string_agg(to_jsonb(s)::text, '' ORDER BY s.name) FROM runrow.schedule AS s),
        (SELECT string_agg(to_jsonb(p)::text, '' ORDER BY p.model) FROM runrow.model_price AS p),
        (SELECT string_agg(to_jsonb(l)::text, '' ORDER BY l.rate_limit_key) FROM runrow.rate_limit AS l),
        (SELECT string_agg(to_jsonb(c)::text, '' ORDER BY c.concurrency_key) FROM runrow.concurrency_limit AS c),
        (SELECT string_agg(to_jsonb(b)::text, '' ORDER BY b.fairness_key) FROM runrow.tenant_budget AS b),
        (SELECT string_agg(to_jsonb(f)::text, '' ORDER BY f.fairness_key) FROM runrow.fairness_tenant AS f),
        (SELECT string_agg(to_jsonb(t)::text, '' ORDER BY t.idempotency_key) FROM runrow.tool_effect AS t),
        (SELECT string_agg(to_jsonb(w)::text, '' ORDER BY w.id) FROM runrow.webhook_delivery AS w)))
$$;

-- The three characters, each after a prefix: a line break, U+202E (right-to-left override),
-- U+0085 (NEL, a C1 control).
CREATE TEMP TABLE bad_char (c text, code text);
INSERT INTO bad_char VALUES (E'\n', '000A'), (E'\u202e', '202E'), (E'\u0085', '0085');

-- Each function and identifier: the call, with %L where the bad value goes, and the value's prefix.
CREATE TEMP TABLE id_case (ord serial, fn text, arg text, call text, prefix text DEFAULT 'acme');
INSERT INTO id_case (fn, arg, call, prefix) VALUES
('enqueue_run', 'model', $$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', %L)$$, 'acme'),
('enqueue_run', 'user_id', $$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', user_id => %L)$$, 'acme'),
('enqueue_run', 'idempotency_key',
    $$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', idempotency_key => %L)$$, 'acme'),
('enqueue_run', 'fairness_key',
    $$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', fairness_key => %L)$$, 'acme'),
('enqueue_run', 'concurrency_key',
    $$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', concurrency_key => %L)$$, 'acme'),
('enqueue_run', 'rate_limit_key',
    $$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', rate_limit_key => %L)$$, 'acme'),
('enqueue_run', 'webhook_url',
    $$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', webhook_url => %L)$$, 'https://h.example/'),
('create_schedule', 'name', $$SELECT runrow.create_schedule(%L, '* * * * *', '"x"', 'm')$$, 'acme'),
('create_schedule', 'model', $$SELECT runrow.create_schedule('s-ok', '* * * * *', '"x"', %L)$$, 'acme'),
('create_schedule', 'user_id', $$SELECT runrow.create_schedule('s-ok', '* * * * *', '"x"', 'm', user_id => %L)$$, 'acme'),
('create_schedule', 'fairness_key',
    $$SELECT runrow.create_schedule('s-ok', '* * * * *', '"x"', 'm', fairness_key => %L)$$, 'acme'),
('create_schedule', 'concurrency_key',
    $$SELECT runrow.create_schedule('s-ok', '* * * * *', '"x"', 'm', concurrency_key => %L)$$, 'acme'),
('fork_run', 'model', $$SELECT runrow.fork_run(gen_random_uuid(), 0, %L)$$, 'acme'),
('claim_run', 'worker_id', $$SELECT * FROM runrow.claim_run(%L)$$, 'acme'),
('claim_runs', 'worker_id', $$SELECT * FROM runrow.claim_runs(%L)$$, 'acme'),
('finish_and_claim_runs', 'worker_id', $$SELECT * FROM runrow.finish_and_claim_runs('[]', %L)$$, 'acme'),
('claim_webhook_deliveries', 'worker_id', $$SELECT * FROM runrow.claim_webhook_deliveries(%L)$$, 'acme'),
('begin_tool_call', 'tool',
    $$SELECT runrow.begin_tool_call(gen_random_uuid(), gen_random_uuid(), repeat('a', 64), %L, '{}', 'pure')$$, 'acme'),
('resolve_approval', 'decided_by', $$SELECT runrow.resolve_approval(repeat('0', 64), true, %L)$$, 'acme'),
('set_model_price', 'model', $$SELECT runrow.set_model_price(%L, 3, 15, 3.75, 0.3)$$, 'acme'),
('set_rate_limit', 'rate_limit_key', $$SELECT runrow.set_rate_limit(%L, 10, NULL, NULL)$$, 'acme'),
('set_concurrency_limit', 'concurrency_key', $$SELECT runrow.set_concurrency_limit(%L, 5)$$, 'acme'),
('set_tenant_budget', 'fairness_key', $$SELECT runrow.set_tenant_budget(%L, 1000, NULL)$$, 'acme'),
('set_fairness_weight', 'fairness_key', $$SELECT runrow.set_fairness_weight(%L, 2)$$, 'acme'),
-- Stop 60's audit: identifiers that were stored, or quoted back in an error, unchecked.
('enqueue_run', 'if_active', $$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', if_active => %L)$$, 'acme'),
('append_step', 'kind', $$SELECT runrow.append_step(gen_random_uuid(), gen_random_uuid(), %L, '[]')$$, 'acme'),
('append_step', 'request_id', $$SELECT runrow.append_step(gen_random_uuid(), gen_random_uuid(), 'model_turn',
    '[{"type": "text", "text": "hi"}]', request_id => %L)$$, 'req_01'),
('append_step', 'stop_reason', $$SELECT runrow.append_step(gen_random_uuid(), gen_random_uuid(), 'model_turn',
    '[{"type": "text", "text": "hi"}]', stop_reason => %L)$$, 'end_turn'),
('append_step', 'payload[1].id', $$SELECT runrow.append_step(gen_random_uuid(), gen_random_uuid(), 'model_turn',
    json_build_array(json_build_object('type', 'text', 'text', 'hi'),
        json_build_object('type', 'tool_use', 'id', %L::text, 'name', 't', 'input', '{}'::json)))$$, 'toolu_1'),
('append_step', 'payload.tool_use_id', $$SELECT runrow.append_step(gen_random_uuid(), gen_random_uuid(), 'tool_result',
    json_build_object('type', 'tool_result', 'tool_use_id', %L::text))$$, 'toolu_1'),
('begin_tool_call', 'effect',
    $$SELECT runrow.begin_tool_call(gen_random_uuid(), gen_random_uuid(), repeat('a', 64), 't', '{}', %L)$$, 'pure'),
('finish_run', 'status', $$SELECT runrow.finish_run(gen_random_uuid(), gen_random_uuid(), %L)$$, 'failed'),
('create_schedule', 'cron', $$SELECT runrow.create_schedule('s-ok', %L, '"x"', 'm')$$, '0 3 * *'),
('create_schedule', 'if_active', $$SELECT runrow.create_schedule('s-ok', '* * * * *', '"x"', 'm', if_active => %L)$$, 'acme'),
('create_schedule', 'catch_up', $$SELECT runrow.create_schedule('s-ok', '* * * * *', '"x"', 'm', catch_up => %L)$$, 'each'),
('drop_schedule', 'name', $$SELECT runrow.drop_schedule(%L)$$, 'acme'),
('notify_probe', 'channel', $$SELECT runrow.notify_probe(%L)$$, 'runrow_probe_'),
('resolve_approval', 'idempotency_key', $$SELECT runrow.resolve_approval(%L, true, 'ann')$$, 'acme');

-- A queued run a refused claim would have taken, and a delivery a refused webhook claim would.
SELECT pg_temp.drain_queue();
SELECT run_id AS queued FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', webhook_url => 'https://h.example/') \gset
SELECT pg_temp.everything() AS before \gset

-- 38 identifiers x 3 characters: 22023, the argument named, the character by its code point and
-- position (the value is not quoted, so the character cannot reach the log through the error).
SELECT throws_ok(
    format(k.call, k.prefix || b.c || 'x'), '22023',
    format('%s must not hold control characters (C0, C1 or bidirectional formatting), got U+%s at character %s',
        k.arg, b.code, length(k.prefix) + 1),
    format('%s refuses a %s holding U+%s', k.fn, k.arg, b.code))
FROM id_case AS k CROSS JOIN bad_char AS b
ORDER BY k.ord, b.code;

SELECT is(pg_temp.everything(), :'before', 'nothing was written by any of the 114 refused calls');
SELECT is((SELECT status FROM runrow.agent_run WHERE id = :'queued'), 'queued', 'the refused claims claimed nothing');

-- The other characters of the class: C0 (U+0001, U+001F), DEL, C1's ends, the bidirectional ones.
SELECT ok(NOT runrow._printable('a' || chr(c)), format('U+%s is refused', lpad(upper(to_hex(c)), 4, '0')))
FROM unnest(ARRAY[1, 9, 31, 127, 128, 159, 1564, 8206, 8207, 8234, 8238, 8294, 8297]) AS c;
SELECT ok(runrow._printable('a' || chr(c)), format('U+%s passes', lpad(upper(to_hex(c)), 4, '0')))
FROM unnest(ARRAY[32, 126, 160, 8205, 8239, 8293, 8298]) AS c;
SELECT is(runrow._printable(NULL), NULL, 'NULL is unknown: an optional identifier left out passes');

-- Ordinary names: spaces, dots, slashes, colons, non-ASCII letters, an emoji joined by U+200D.
SELECT lives_ok($$SELECT * FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'vendor/model:v1.2 beta',
    user_id => '租户', idempotency_key => 'req 1/2:3.4', fairness_key => 'ünïcode-tenant',
    concurrency_key => 'team a/b:c.d', rate_limit_key => 'org.acme/keys:1',
    webhook_url => 'https://hooks.example/ünï/租户?a=b:c')$$, 'enqueue_run takes ordinary names');
SELECT is((SELECT fairness_key FROM runrow.agent_run WHERE idempotency_key = 'req 1/2:3.4'), 'ünïcode-tenant',
    'and stores them as given');
SELECT lives_ok($$SELECT runrow.create_schedule('租户 nightly/run:1.0', '0 3 * * *', '"x"', 'vendor/model:v1.2',
    user_id => 'ünïcode user', fairness_key => '租户', concurrency_key => 'a.b/c:d')$$,
    'create_schedule takes ordinary names');
SELECT lives_ok($$SELECT runrow.set_model_price('vendor/model:v1.2 ü', 3, 15, 3.75, 0.3)$$, 'set_model_price too');
SELECT lives_ok($$SELECT runrow.set_rate_limit('org.acme/keys:租户', 10, NULL, NULL)$$, 'set_rate_limit too');
SELECT lives_ok($$SELECT runrow.set_concurrency_limit('team a/b:ü', 5)$$, 'set_concurrency_limit too');
SELECT lives_ok($$SELECT runrow.set_tenant_budget('ünïcode-tenant', 1000, NULL)$$, 'set_tenant_budget too');
SELECT lives_ok($$SELECT runrow.set_fairness_weight('👩‍💻 team/1:2', 2)$$, 'set_fairness_weight too');
SELECT lives_ok($$SELECT * FROM runrow.claim_webhook_deliveries('worker ü/1:2.3')$$, 'claim_webhook_deliveries too');
SELECT run_id AS claimed FROM runrow.claim_runs('worker 租户/1:2.3', 1) \gset
SELECT is((SELECT worker_id FROM runrow.agent_run WHERE id = :'claimed'), 'worker 租户/1:2.3', 'claim_runs too');

-- The line and paragraph separators too (Python's splitlines and JavaScript break lines there).
SELECT throws_ok(format($$SELECT runrow.enqueue_run(gen_random_uuid(), '"q"', 'm', fairness_key => %L)$$, E'a\u2028b'),
    '22023', 'fairness_key must not hold control characters (C0, C1 or bidirectional formatting), got U+2028 at character 2',
    'a fairness_key with a line separator');
-- A weight's reset (NULL) of a key stored before the rule goes through, as the other setters
-- remove such a key.
SELECT lives_ok(format('SELECT runrow.set_fairness_weight(%L, NULL)', E'old\nkey'),
    'set_fairness_weight resets a key stored before the rule');

-- The tables refuse them too (0085), as a CHECK would: 23514 naming the rule.
SELECT throws_ok(format('UPDATE runrow.agent_run SET fairness_key = %L WHERE id = %L', E'a\nb', :'queued'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_identifiers_printable"',
    'agent_run refuses a fairness_key with a line break');
SELECT throws_ok(format('UPDATE runrow.agent_run SET user_id = %L WHERE id = %L', E'a\u202eb', :'queued'),
    '23514', NULL, 'and a user_id with an override (user_id joined the settings trigger''s columns)');
SELECT throws_ok(format($$INSERT INTO runrow.model_price (model, input_per_mtok, output_per_mtok,
    cache_write_per_mtok, cache_read_per_mtok, cache_write_1h_per_mtok) VALUES (%L, 1, 1, 1, 1, 2)$$, E'm\u0085'),
    '23514', 'new row for relation "model_price" violates check constraint "model_price_model_printable"',
    'model_price refuses it');
SELECT throws_ok(format('INSERT INTO runrow.concurrency_limit (concurrency_key, max_running) VALUES (%L, 1)', E'k\n'),
    '23514', 'new row for relation "concurrency_limit" violates check constraint "concurrency_limit_key_printable"',
    'concurrency_limit refuses it');
SELECT throws_ok(format('INSERT INTO runrow.tenant_budget (fairness_key, tokens_per_day) VALUES (%L, 1)', E'k\u2066'),
    '23514', 'new row for relation "tenant_budget" violates check constraint "tenant_budget_key_printable"',
    'tenant_budget refuses it');
SELECT throws_ok(format('UPDATE runrow.schedule SET concurrency_key = %L', E'k\u0085'),
    '23514', 'new row for relation "schedule" violates check constraint "schedule_identifiers_printable"',
    'schedule refuses it in the template');
SELECT throws_ok(format('UPDATE runrow.schedule SET name = %L', E'n\u202e'),
    '23514', 'new row for relation "schedule" violates check constraint "schedule_name_printable"',
    'and in the name, the bidirectional controls included');

-- A row stored before the rule stays usable: its other columns are updated, and a queued run
-- holding such a key is still claimed (a CHECK, even NOT VALID, would refuse both).
-- Its concurrency limit too: the claim stamps the limit's last_claimed_at, and a CHECK there
-- (the first 0085) failed every claim that met one such limit (the review).
ALTER TABLE runrow.agent_run DISABLE TRIGGER agent_run_settings;
ALTER TABLE runrow.schedule DISABLE TRIGGER schedule_identifiers_printable;
ALTER TABLE runrow.concurrency_limit DISABLE TRIGGER concurrency_limit_key_printable;
SELECT pg_temp.drain_queue();
SELECT run_id AS old_run FROM runrow.enqueue_run(gen_random_uuid(), '"q"', 'm') \gset
UPDATE runrow.agent_run SET fairness_key = E'old\nkey', concurrency_key = E'old\u0085cap' WHERE id = :'old_run';
INSERT INTO runrow.concurrency_limit (concurrency_key, max_running) VALUES (E'old\u0085cap', 2);
UPDATE runrow.schedule SET model = E'old\u202emodel' WHERE name = '租户 nightly/run:1.0';
ALTER TABLE runrow.agent_run ENABLE TRIGGER agent_run_settings;
ALTER TABLE runrow.schedule ENABLE TRIGGER schedule_identifiers_printable;
ALTER TABLE runrow.concurrency_limit ENABLE TRIGGER concurrency_limit_key_printable;
SELECT is((SELECT run_id FROM runrow.claim_run('w') LIMIT 1), :'old_run'::uuid,
    'a run stored before the rule with such a key is still claimed');
SELECT isnt((SELECT last_claimed_at FROM runrow.concurrency_limit WHERE concurrency_key = E'old\u0085cap'), NULL,
    'under its concurrency limit stored before the rule, which the claim stamps');
SELECT lives_ok($$UPDATE runrow.schedule SET next_fire_at = now() WHERE name = '租户 nightly/run:1.0'$$,
    'a schedule stored before the rule still takes a firing pass''s update');

-- A new run's identifiers are tested once, by enqueue_run (22023 naming the argument): agent_run's
-- settings trigger tests the copies, so a run stored before the rule is neither retried nor forked.
SELECT finish_run AS failed_old FROM runrow.finish_run(:'old_run',
    (SELECT claim_token FROM runrow.agent_run WHERE id = :'old_run'), 'failed', error => 'x') \gset
SELECT throws_ok(format('SELECT runrow.retry_run(%L)', :'old_run'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_identifiers_printable"',
    'a run stored before the rule with such a key is not retried');
SELECT throws_ok(format('SELECT runrow.fork_run(%L, 0)', :'old_run'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_identifiers_printable"',
    'nor forked');
-- A schedule named before the rule (0085 added the bidirectional controls) is still dropped.
ALTER TABLE runrow.schedule DISABLE TRIGGER schedule_name_printable;
UPDATE runrow.schedule SET name = E'old\u202ename' WHERE name = '租户 nightly/run:1.0';
ALTER TABLE runrow.schedule ENABLE TRIGGER schedule_name_printable;
SELECT lives_ok(format('SELECT runrow.drop_schedule(%L)', E'old\u202ename'),
    'drop_schedule drops a schedule named before the rule');

-- enqueue_run tests a new run's identifiers for its 22023; the table tests them again on the
-- INSERT, whoever writes the row: a raw INSERT by the owner is refused too.
SELECT throws_ok(format($$INSERT INTO runrow.agent_run (conversation_id, user_id, user_message_id, model, prompt_id,
    fairness_key) SELECT conversation_id, user_id, user_message_id, model, prompt_id, %L FROM runrow.agent_run
    WHERE id = %L$$, E'raw\nkey', :'queued'),
    '23514', 'new row for relation "agent_run" violates check constraint "agent_run_identifiers_printable"',
    'a raw INSERT of a new run with a line break in its fairness_key is refused by the table');

SELECT * FROM finish();
ROLLBACK;
