-- acquire_model_call's choice of a key error's probe (migration 0101): a run refused with a 403
-- since the key's last answer (the 403 may be its own request's) leaves the probe to another run
-- of the key waiting for it, and is the probe when none waits. Before, the claim order could make
-- such a run the probe every time: each refusal doubled the block, nothing of the key was ever
-- answered, and the key's other runs waited with it for ever. now() is fixed inside this
-- transaction: time passes by moving the block into the past.
BEGIN;
\ir helpers/setup.psql
\ir helpers/lifecycle.psql
\ir helpers/key_errors.psql
SELECT plan(19);
SELECT pg_temp.drain_queue();

-- A 403 unless told, the longest block 300 s (report_key_error's default).
CREATE FUNCTION pg_temp.refused(run uuid, msg text DEFAULT 'permission_error: no access to the beta')
RETURNS numeric LANGUAGE sql AS $$ SELECT pg_temp.report(run, msg, 300) $$;
CREATE FUNCTION pg_temp.probe(key text) RETURNS uuid LANGUAGE sql AS $$
    SELECT key_probe_by FROM runrow.rate_limit WHERE rate_limit_key = key
$$;

-- A run refused with a 403, and another run of the key queued, due: the other is the probe.
SELECT pg_temp.keyed_run('kp') AS r \gset
SELECT is(pg_temp.refused(:'r'), 5.000, 'the first refusal blocks the key');
SELECT is(pg_temp.acquire(:'r'), '(f,5.000,blocked)', 'the run is held by its own block');
SELECT pg_temp.keyed_run('kp', claimed => false) AS o \gset
SELECT pg_temp.time_passes('kp');
SELECT pg_temp.fingerprint() || (SELECT md5(to_jsonb(l)::text) FROM runrow.rate_limit AS l
    WHERE l.rate_limit_key = 'kp') AS before \gset
SELECT is(runrow.acquire_model_call(:'r', gen_random_uuid(), 10), NULL, 'fenced out: no row');
SELECT is(pg_temp.fingerprint() || (SELECT md5(to_jsonb(l)::text) FROM runrow.rate_limit AS l
    WHERE l.rate_limit_key = 'kp'), :'before', 'and nothing written');
SELECT is(pg_temp.acquire(:'r'), '(f,15,probe_elsewhere)',
    'the block over, the run refused since the key''s last answer leaves the probe to the queued run');
SELECT is((SELECT (block_told_until, model_call_reserved)::text FROM runrow.agent_run WHERE id = :'r'), '(,)',
    'nothing granted, and no block told: a lift must not make its deferral due at once');
SELECT is(pg_temp.probe('kp'), NULL, 'no probe is out');
SELECT pg_temp.claim(:'o');
SELECT is(pg_temp.acquire(:'o'), '(t,0,)', 'the queued run, claimed, is the probe');
SELECT is(pg_temp.probe('kp'), :'o'::uuid, 'and the key''s probe');
SELECT is(pg_temp.acquire(:'r'), '(f,5.000,blocked)', 'the run is held while the probe is out');
-- The other run's probe refused with the same 403: the key's, and it is refused since the key's
-- last answer too. Two such runs do not leave the probe to each other.
SELECT is(pg_temp.refused(:'o'), 10.000, 'the probe refused: the block doubles');
SELECT pg_temp.time_passes('kp');
SELECT is(pg_temp.acquire(:'r'), '(t,0,)', 'with only runs refused since the answer left, the run is the probe');
-- The probe answered: the key works, the run asks as any other.
SELECT pg_temp.answered(:'r');
SELECT is(pg_temp.acquire(:'o'), '(t,0,)', 'the key works: no probe, nobody held');
SELECT runrow.finish_run(:'r', pg_temp.token(:'r'), 'completed');
SELECT runrow.finish_run(:'o', pg_temp.token(:'o'), 'completed');

-- Runs that do not wait for the key: one queued for an hour from now, and the run's own
-- conversation's next turn (queued behind the run itself). The run is the probe.
SELECT pg_temp.keyed_run('kalone') AS a \gset
SELECT is(pg_temp.refused(:'a'), 5.000, 'the first refusal');
SELECT pg_temp.keyed_run('kalone', claimed => false) AS later \gset
UPDATE runrow.agent_run SET not_before = now() + interval '1 hour' WHERE id = :'later';
SELECT pg_temp.keyed_run('kalone', (SELECT conversation_id FROM runrow.agent_run WHERE id = :'a'), false) AS behind \gset
SELECT pg_temp.time_passes('kalone');
SELECT is(pg_temp.acquire(:'a'), '(t,0,)',
    'no run waits for the key (one due in an hour, one behind the run''s own turn): the run is the probe');
SELECT is(pg_temp.probe('kalone'), :'a'::uuid, 'the key''s probe');
SELECT runrow.cancel_run(:'later'), runrow.cancel_run(:'behind');

-- A 401 (not a 403: never the request's own) leaves nothing to another run.
SELECT pg_temp.keyed_run('k401') AS k \gset
SELECT pg_temp.keyed_run('k401') AS k2 \gset
SELECT is(pg_temp.refused(:'k', 'authentication_error: invalid x-api-key'), 5.000, 'a 401 blocks the key');
SELECT pg_temp.time_passes('k401');
SELECT is(pg_temp.acquire(:'k'), '(t,0,)', 'after a 401 the run may be the probe with another run waiting');

-- A 403 refused before the key's last answer does not count: the run may be the probe.
SELECT pg_temp.keyed_run('kold') AS p \gset
SELECT pg_temp.keyed_run('kold') AS q \gset
SELECT pg_temp.refused(:'p');
SELECT pg_temp.time_passes('kold');
SELECT is(pg_temp.acquire(:'q'), '(t,0,)', 'another run''s probe');
SELECT pg_temp.answered(:'q');
SELECT pg_temp.refused(:'q', 'authentication_error: invalid x-api-key');
SELECT pg_temp.time_passes('kold');
SELECT is(pg_temp.acquire(:'p'), '(t,0,)',
    'a run refused before the key''s last answer is the new streak''s probe like any other');

SELECT * FROM finish();
ROLLBACK;
