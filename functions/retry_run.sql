CREATE OR REPLACE FUNCTION runrow.retry_run(run_id uuid)
RETURNS uuid
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    old runrow.agent_run;
    new_id uuid;
BEGIN
    PERFORM runrow._require_not_null(retry_run.run_id, 'run_id');
    SELECT a.* INTO old FROM runrow.agent_run AS a WHERE a.id = retry_run.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run_id % does not exist', retry_run.run_id USING ERRCODE = 'no_data_found';
    END IF;
    IF old.status NOT IN ('failed', 'dead') THEN
        RAISE EXCEPTION 'run_id % is %: only failed or dead runs can be retried', retry_run.run_id, old.status
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    PERFORM runrow._lock_conversation(old.conversation_id);

    -- A run is retried at most once (unique index on retry_of): a second call returns
    -- the retry already made.
    SELECT a.id INTO new_id FROM runrow.agent_run AS a WHERE a.retry_of = old.id;
    IF FOUND THEN
        RETURN new_id;
    END IF;

    -- The old run's fleet settings too (claimable now, not at its not_before): without them the
    -- retry escaped its tenant's budget and fair share (fairness_key NULL is the anonymous
    -- tenant), its rate limit and concurrency cap, and nobody heard of its end.
    -- A fork's retry is the fork again: forked_from, forked_at_seq and the steps it was given.
    INSERT INTO runrow.agent_run (
        conversation_id, user_id, user_message_id, max_attempts, model, prompt_id, metadata, retry_of,
        priority, fairness_key, concurrency_key, rate_limit_key, token_budget, cost_budget, webhook_url,
        forked_from, forked_at_seq
    )
    VALUES (
        old.conversation_id, old.user_id, old.user_message_id, old.max_attempts, old.model,
        old.prompt_id, old.metadata, old.id,
        old.priority, old.fairness_key, old.concurrency_key, old.rate_limit_key, old.token_budget,
        old.cost_budget, old.webhook_url, old.forked_from, old.forked_at_seq
    )
    RETURNING id INTO new_id;

    -- The steps a fork was given (1..forked_at_seq, copied from its source) are its input, not
    -- what an attempt did: without them the retry started from the user message alone and
    -- asked the model again from scratch, running the forked tool calls again under new keys
    -- (the history audit). Copied verbatim, as fork_run copies them.
    IF old.forked_at_seq > 0 THEN
        PERFORM runrow._copy_steps(old.id, new_id, old.forked_at_seq);
    END IF;

    -- Rebuilt from the kept message, as enqueue_run builds it: the old run's request may be
    -- trimmed, and a run without one would hide its journal from trim_journal.
    INSERT INTO runrow.run_request (run_id, snapshot)
    SELECT new_id, jsonb_build_object('content', m.content, 'metadata', old.metadata)
    FROM runrow.message AS m WHERE m.id = old.user_message_id;

    PERFORM runrow._journal(new_id, jsonb_build_array(
        jsonb_build_object('type', 'user_message_created', 'message_id', old.user_message_id),
        jsonb_build_object('type', 'run_queued', 'run_id', new_id, 'retry_of', old.id)
    ));
    PERFORM runrow._wake_dispatchers(old.conversation_id);
    RETURN new_id;
END
$fn$;

COMMENT ON FUNCTION runrow.retry_run(uuid) IS
'A person''s decision to run a failed or dead run again: a new queued run of the same '
'conversation, user message, model, pinned prompt, metadata and fleet settings (priority, '
'fairness_key, concurrency_key, rate_limit_key, token_budget, cost_budget, webhook_url; '
'claimable at once), with retry_of pointing at the old run '
'(which stays as it ended). A fork''s retry is the fork again: the same forked_from and '
'forked_at_seq, and the steps 1..forked_at_seq it was given, copied verbatim. Idempotent: a run is retried at most once and a second call '
'returns the same new run. Any other status raises 55000; an unknown run_id P0002.';

REVOKE ALL ON FUNCTION runrow.retry_run(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.retry_run(uuid) TO runrow_client;
