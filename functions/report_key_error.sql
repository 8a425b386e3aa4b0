CREATE OR REPLACE FUNCTION runrow.report_key_error(
    run_id uuid,
    claim_token uuid,
    error text,
    first_block_seconds numeric DEFAULT 5,
    max_block_seconds numeric DEFAULT 300,
    own_request_possible boolean DEFAULT false,
    give_up_after_seconds numeric DEFAULT 3600
)
RETURNS numeric
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    key text;
    conversation uuid;
    seen bigint;
    -- The 403 this run's request last got (key_error_refused), and this one if it is a 403.
    last_refused text;
    -- When this run was first refused with that 403 in the key's streak (migration 0110).
    first_refused timestamptz;
    refused text := CASE WHEN report_key_error.own_request_possible THEN left(report_key_error.error, 1000) END;
    l runrow.rate_limit;
    streak integer;
    block numeric;
    until timestamptz;
    blocked timestamptz;
BEGIN
    PERFORM runrow._require_not_null(report_key_error.run_id, 'run_id');
    PERFORM runrow._require_not_null(report_key_error.claim_token, 'claim_token');
    PERFORM runrow._require_not_null(report_key_error.error, 'error');
    PERFORM runrow._require_not_null(report_key_error.first_block_seconds, 'first_block_seconds');
    PERFORM runrow._require_not_null(report_key_error.max_block_seconds, 'max_block_seconds');
    PERFORM runrow._require_not_null(report_key_error.own_request_possible, 'own_request_possible');
    PERFORM runrow._require_not_null(report_key_error.give_up_after_seconds, 'give_up_after_seconds');
    -- Unicode's white space (_white_space): btrim's default, the space alone, let a tab and a
    -- newline block the key with a blank error (the SQL API audit).
    IF btrim(report_key_error.error, runrow._white_space()) = '' THEN
        RAISE EXCEPTION 'error must not be empty or only white space' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT (report_key_error.first_block_seconds >= 0.001 AND report_key_error.first_block_seconds <= 86400) THEN
        RAISE EXCEPTION 'first_block_seconds must be from 0.001 to 86400, got %', report_key_error.first_block_seconds
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT (report_key_error.max_block_seconds >= report_key_error.first_block_seconds
            AND report_key_error.max_block_seconds <= 86400) THEN
        RAISE EXCEPTION 'max_block_seconds must be from first_block_seconds (%) to 86400, got %',
            report_key_error.first_block_seconds, report_key_error.max_block_seconds
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT (report_key_error.give_up_after_seconds >= greatest(report_key_error.max_block_seconds, 600)
            AND report_key_error.give_up_after_seconds <= 604800) THEN
        RAISE EXCEPTION 'give_up_after_seconds must be from greatest(max_block_seconds, 600) (%) to 604800, got %',
            greatest(report_key_error.max_block_seconds, 600), report_key_error.give_up_after_seconds
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF NOT runrow._hold_claim(report_key_error.run_id, report_key_error.claim_token) THEN
        RETURN NULL;  -- fenced out: nothing written
    END IF;
    SELECT a.rate_limit_key, a.conversation_id, a.key_error_answers, a.key_error_refused, a.key_error_first_refused_at
    INTO key, conversation, seen, last_refused, first_refused
    FROM runrow.agent_run AS a WHERE a.id = report_key_error.run_id;
    IF key IS NULL THEN
        PERFORM runrow._key_error_told(report_key_error.run_id, NULL, refused);
        RETURN NULL;
    END IF;
    INSERT INTO runrow.rate_limit AS r (rate_limit_key) VALUES (key)
    ON CONFLICT ON CONSTRAINT rate_limit_pkey DO NOTHING;
    SELECT r.* INTO STRICT l FROM runrow.rate_limit AS r WHERE r.rate_limit_key = key FOR UPDATE;

    -- Only the same 403 as this run's last refusal can be its own request's (migration 0099): a
    -- key that broke again with another 403 (workers with different API keys may share a
    -- rate_limit_key) blocks the key as any key error, and fails none of the runs the first
    -- outage left waiting. A 401, 402 or "credit balance" (refused NULL) is never the request's:
    -- a key that broke again (a rotation half-way through the fleet, the credit spent again)
    -- stays a key error.
    IF refused = last_refused AND l.key_answers > seen AND l.key_errors = 0 THEN
        -- The key answered a request sent after this run's last key error (its probe, another
        -- run's: this run's own answer clears seen), and refuses this run's again with an error
        -- that may be about the request (a 403: a beta, a tool type, a file the organisation may
        -- not use): it is, and recurs on every retry. The run fails once; the key is not blocked.
        -- Only while the key works (key_errors = 0, migration 0101): a streak in force began
        -- with a refusal after that answer, a new outage of the key, and the run's refusal is
        -- one of it (the probe of the new streak, a request on the wire), not its own. Before,
        -- a second outage with the same 403 text failed one run left waiting from the first
        -- per probe.
        PERFORM runrow.finish_run(report_key_error.run_id, report_key_error.claim_token, 'failed', NULL,
            'model API refused the request: ' || refused
            || ' (refused again after the key answered another request since this run''s last '
            || 'refusal: the error is about this run''s request, not the key; not retried)');
        RETURN NULL;
    END IF;
    IF refused = last_refused AND l.key_answers = seen AND l.key_probe_by = report_key_error.run_id
       AND first_refused <= now() - make_interval(secs => greatest(report_key_error.max_block_seconds, 600)::float8)
       AND NOT runrow._key_has_other_answerer(l, report_key_error.run_id, conversation, coalesce(l.key_probe_forced, false), false)
       AND (first_refused <= now() - make_interval(secs => report_key_error.give_up_after_seconds::float8)
            OR NOT runrow._key_has_other_answerer(l, report_key_error.run_id, conversation, false, true)) THEN
        -- No other run of the key can answer (_key_has_other_answerer, acquire_model_call's
        -- question for probe_elsewhere too, migration 0107: another conversation's run, running
        -- or due within 15 s of the key error's hold, not refused a 403 since the key's last
        -- answer itself; only a running one when the probe was forced past probe_elsewhere's
        -- bound, key_probe_forced, migration 0110: the queued run it was left to is one the claim
        -- does not hand out, and counted it kept the run refused, an API call a block, for ever),
        -- and the run's probe is refused with the same 403 when the run's own refusals began
        -- (key_error_first_refused_at, 0110) at least max_block_seconds, and at least 600 s, ago
        -- on the database clock; give_up_after_seconds (default 3600) when other runs of the key
        -- were refused with a 403 since its last answer too (a refusal several requests share is
        -- the key's, most likely). The run's own age, not the key's streak's (0110): from the
        -- streak's, once the key had refused 600 s every run already refused failed at its next
        -- probe, so a 30-minute key-wide outage failed all the key's runs, one a block, and a run
        -- enqueued late in it failed at its second refusal. Timed, not counted in blocks
        -- (migration 0101): the block reaching max_block_seconds was the rule, and with
        -- key_error_max_block equal to key_error_first_block (allowed) it failed the run on its
        -- second refusal, 5 s into a real outage. 600 s: a key outage of a few minutes (a
        -- rotation, a top-up) fails nothing; max_block_seconds when longer: the operator's
        -- longest wait between probes, so the run has seen at least one. It is taken for the
        -- run's own request: the run fails once. The probe is over; the key's hold stands (the key
        -- may be broken: its next probe tells). Only with no other answerer: with another run of
        -- the key able to answer, a long key-wide 403 would fail one run per longest block, and
        -- that run's answer tells the two apart (the rule above). Runs refused with the 403 since
        -- the key's last answer do not count as answerers (0107): two or more such runs were each
        -- the probe in turn, each refusal found the others open, and none ever ended. Nor does
        -- the run's own conversation's next turn: it waits behind the run. Read on this path
        -- only, once per block of a key.
        UPDATE runrow.rate_limit AS r SET key_probe_by = NULL, updated_at = now() WHERE r.rate_limit_key = key;
        PERFORM runrow.finish_run(report_key_error.run_id, report_key_error.claim_token, 'failed', NULL,
            'model API refused the request: ' || refused
            || format(' (refused again as the key''s probe %s s after this run''s first refusal, the '
                || 'key''s refusal %s in a row, and no request of the key answered since this run''s '
                || 'last refusal: taken for this run''s request, not the key; not retried)',
                floor(extract(EPOCH FROM now() - first_refused))::bigint, l.key_errors + 1));
        RETURN NULL;
    END IF;

    IF l.key_errors > 0 AND l.key_probe_by IS NULL AND l.key_error_until > now() THEN
        -- A request that was on the wire before the block was known: the block stands as it is.
        UPDATE runrow.rate_limit AS r
        SET key_error = left(report_key_error.error, 1000), updated_at = now()
        WHERE r.rate_limit_key = key;
        RETURN runrow._key_error_told(report_key_error.run_id, greatest(l.blocked_until, l.key_error_until), refused);
    END IF;

    -- The first error, or the probe (or a request after the block) found the key still broken:
    -- the next block is twice the last, up to max_block_seconds. A streak whose last block
    -- ended over an hour ago, with no answer since, is over: it starts again.
    streak := CASE WHEN l.key_errors > 0 AND l.key_error_until > now() - interval '1 hour'
        THEN least(l.key_errors, 1000000) + 1 ELSE 1 END;
    block := round(least(report_key_error.max_block_seconds,
        report_key_error.first_block_seconds * power(2::numeric, least(streak - 1, 30))), 3);
    until := now() + make_interval(secs => block::double precision);
    -- A longer rate block in force (a 429's, a response's headers') is never shortened
    -- (greatest skips a NULL).
    blocked := greatest(until, l.rate_blocked_until);
    UPDATE runrow.rate_limit AS r
    SET blocked_until = blocked,
        blocked_by_run = CASE WHEN blocked = until THEN report_key_error.run_id ELSE r.blocked_by_run END,
        key_error = left(report_key_error.error, 1000),
        key_errors = streak,
        key_error_since = CASE WHEN streak = 1 THEN now() ELSE r.key_error_since END,
        key_error_until = until,
        key_error_block = block,
        key_error_max_block = report_key_error.max_block_seconds,
        key_probe_by = NULL,
        updated_at = now()
    WHERE r.rate_limit_key = key;
    RETURN runrow._key_error_told(report_key_error.run_id, blocked, refused);
END
$fn$;

COMMENT ON FUNCTION runrow.report_key_error(uuid, uuid, text, numeric, numeric, boolean, numeric) IS
'A worker got an error about the API key or account (401 authentication_error, 402 '
'billing_error, a 403 permission_error about the key, the 400 "credit balance is too low") for '
'the run it holds: not the run''s fault, so the run''s rate_limit_key is blocked fleet-wide as '
'for a 429, and the worker defers the run (defer_run) for the seconds returned. The first '
'error blocks for first_block_seconds; when the block has ended and the key''s next request '
'(the one probe acquire_model_call lets through) fails again, the block doubles, up to '
'max_block_seconds. A report while the block is in force and no probe is out (a request sent '
'before the block was known) keeps the block as it is. error (the API''s message, its first '
'1000 characters kept) is shown in rate_limit_blocks. The probe''s answer (its usage settled by '
'append_step or record_usage) ends the streak and lifts its block; the answer to a request '
'granted before the key broke does not. A longer 429 '
'block is never shortened. Returns the seconds until the key may be asked again. '
'The run''s model-call reservation (acquire_model_call) is dropped: a refused call is not billed; '
'the block''s end is kept on the run (block_told_until: defer_run ends the deferral with a block '
'lifted meanwhile). '
'Fenced: NULL '
'and nothing written unless claim_token holds the running run. With own_request_possible (the '
'worker''s word that the error may be about the request: a 403 permission_error), a run refused '
'again after the key answered a request sent since the run''s last key error (the key''s '
'key_answers grew past the run''s key_error_answers) is refused for its own request, not the '
'key, and the key works (no key error reported since that answer: a refusal during a new '
'outage of the key, its probe or a request on the wire, is the outage''s): it is ended failed '
'(finish_run: error "model API refused the request: <error> (...)"), the key is not blocked, '
'and NULL is returned; so is the key''s probe refused when nothing of the key was answered '
'since the run''s last refusal and the run''s own refusals in the key''s streak '
'(agent_run.key_error_first_refused_at) began at least greatest(max_block_seconds, 600) seconds '
'ago on the database clock (a key outage of a few minutes fails nothing, whatever the blocks), '
'when no other run of the key can answer (_key_has_other_answerer, as acquire_model_call asks '
'for probe_elsewhere: a run of another conversation, running, or queued, not behind a turn of '
'its own conversation and due within 15 s of the end of the key error''s hold (key_error_until, '
'not a 429 block''s), and not itself refused a 403 since the key''s last answer; only a running '
'one when the probe was granted past probe_elsewhere''s bound, rate_limit.key_probe_forced); '
'when other runs of the key were refused with a 403 since its last answer too, only once the '
'run''s refusals began give_up_after_seconds ago (default 3600: a refusal several requests '
'share is the key''s, most likely, so a key-wide outage of up to that long fails none of '
'them); the key''s hold stands. So runs of one key all refused with the same 403 each fail at '
'their next refusal past that bound, whether the 403 is their requests'' or the key''s: a 403 '
'refusing every probe that long is not going to clear. max_block_seconds is kept on the key''s row '
'(key_error_max_block) for acquire_model_call''s bound on probe_elsewhere. '
'Either only when the error is the same as the 403 of the run''s last refusal '
'(agent_run.key_error_refused): a key broken again by another 403 is a key error. Bad input (NULL, an empty '
'error, first_block_seconds outside 0.001..86400, max_block_seconds below it or over 86400, '
'give_up_after_seconds below greatest(max_block_seconds, 600) or over 604800) '
'raises 22004/22023.';

REVOKE ALL ON FUNCTION runrow.report_key_error(uuid, uuid, text, numeric, numeric, boolean, numeric) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.report_key_error(uuid, uuid, text, numeric, numeric, boolean, numeric) TO runrow_worker;
