CREATE OR REPLACE FUNCTION runrow.enqueue_run(
    conversation_id uuid,
    content jsonb,
    model text,
    user_id text DEFAULT NULL,
    system_prompt text DEFAULT NULL,
    tools jsonb DEFAULT '[]',
    max_attempts integer DEFAULT 1,
    idempotency_key text DEFAULT NULL,
    if_active text DEFAULT 'enqueue',
    metadata jsonb DEFAULT '{}',
    start_in interval DEFAULT NULL,
    priority integer DEFAULT 0,
    fairness_key text DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    rate_limit_key text DEFAULT NULL,
    token_budget bigint DEFAULT NULL,
    cost_budget numeric DEFAULT NULL,
    webhook_url text DEFAULT NULL
)
RETURNS TABLE (run_id uuid, status text, created boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    existing runrow.agent_run;
    new_message_id uuid;
    new_run_id uuid;
    prompt_id text;
    fingerprint text;
    -- The last seq _journal wrote, read only so that the call is an assignment.
    journaled bigint;
BEGIN
    -- Validate everything before writing anything. The _require_* helpers only raise, so each
    -- is called only when the test before it fails: a PERFORM is a statement, and twelve of
    -- them were about 38 of the 270 us of an enqueue (issue 11). The tests keep the order of
    -- the checks, so the first bad argument is still the one named.
    IF enqueue_run.conversation_id IS NULL OR enqueue_run.content IS NULL THEN
        PERFORM runrow._require_not_null(enqueue_run.conversation_id, 'conversation_id');
        PERFORM runrow._require_not_null(enqueue_run.content, 'content');
    END IF;
    -- The size first: the walk of the blocks below costs with their number (80,000 blocks took
    -- 6.2 s of the backend before the size refused them; the security audit).
    IF octet_length(enqueue_run.content::text) > 1048576 THEN
        RAISE EXCEPTION 'content is too large: % bytes, the limit is 1 MiB', octet_length(enqueue_run.content::text)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Content the API would refuse on every attempt (functions/_request_checks.sql).
    IF NOT runrow._content_ok(enqueue_run.content) THEN
        PERFORM runrow._require_content(enqueue_run.content);
    END IF;
    IF enqueue_run.model IS NULL THEN
        PERFORM runrow._require_not_null(enqueue_run.model, 'model');
    END IF;
    IF enqueue_run.model = '' OR length(enqueue_run.model) > 200 THEN
        RAISE EXCEPTION 'model must be a non-empty model name of at most 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT runrow._model_trimmed(enqueue_run.model) THEN
        PERFORM runrow._require_model_trimmed(enqueue_run.model);
    END IF;
    IF enqueue_run.user_id = '' OR length(enqueue_run.user_id) > 200 THEN
        RAISE EXCEPTION 'user_id must be NULL or 1 to 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(enqueue_run.system_prompt) > 1048576 THEN
        RAISE EXCEPTION 'system_prompt is too large: the limit is 1 MiB'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Each tool an object with a string "name": a jsonpath test is an expression, where an
    -- EXISTS over jsonb_array_elements was a statement on every enqueue (issue 11). Strict, so
    -- that a nested array is not unwrapped into its elements; keyvalue(), so that a missing
    -- "name" is no error (which strict mode would make of @.name). _require_tools says which
    -- tool is wrong; it checks the rest of a definition (name, input_schema, no name twice)
    -- when _pin_prompt first pins the prompt, once per distinct set of tools.
    IF enqueue_run.tools IS NULL OR jsonb_typeof(enqueue_run.tools) <> 'array' OR jsonb_path_exists(
        enqueue_run.tools,
        'strict $[*] ? (@.type() != "object"'
        ' || !exists(@.keyvalue() ? (@.key == "name" && @.value.type() == "string")))'
    ) THEN
        PERFORM runrow._require_tools(enqueue_run.tools);
    END IF;
    IF octet_length(enqueue_run.tools::text) > 1048576 THEN
        RAISE EXCEPTION 'tools is too large: the limit is 1 MiB' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue_run.max_attempts IS NULL OR enqueue_run.max_attempts NOT BETWEEN 1 AND 100 THEN
        PERFORM runrow._require_range(enqueue_run.max_attempts, 'max_attempts', 1, 100);
    END IF;
    IF enqueue_run.idempotency_key = '' OR length(enqueue_run.idempotency_key) > 255 THEN
        RAISE EXCEPTION 'idempotency_key must be NULL or 1 to 255 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF enqueue_run.if_active IS NULL THEN
        PERFORM runrow._require_not_null(enqueue_run.if_active, 'if_active');
    END IF;
    IF enqueue_run.if_active NOT IN ('enqueue', 'reject', 'interrupt') THEN
        -- Quoted below: a control character would reach the log through the error.
        PERFORM runrow._require_printable(enqueue_run.if_active, 'if_active');
        RAISE EXCEPTION 'if_active must be one of enqueue, reject, interrupt, got "%"', left(enqueue_run.if_active, 80)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- An object of at most 1 MiB that JSON clients can read back, with a valid prompt_cache and
    -- traceparent if given (functions/_request_checks.sql; the same rules as create_schedule's).
    IF NOT runrow._metadata_ok(enqueue_run.metadata) THEN
        PERFORM runrow._require_metadata(enqueue_run.metadata);
    END IF;
    -- Judged where it lands (now() + start_in, on the calendar): a start_in with days or months
    -- is the helper's to judge.
    IF NOT runrow._delay_plain(enqueue_run.start_in, interval '366 days') THEN
        PERFORM runrow._require_delay(enqueue_run.start_in, 'start_in', interval '366 days');
    END IF;
    IF enqueue_run.priority IS NULL OR enqueue_run.priority NOT BETWEEN -1000 AND 1000
       OR enqueue_run.fairness_key = '' OR length(enqueue_run.fairness_key) > 200
       OR enqueue_run.concurrency_key = '' OR length(enqueue_run.concurrency_key) > 200
       OR enqueue_run.rate_limit_key = '' OR length(enqueue_run.rate_limit_key) > 200 THEN
        PERFORM runrow._require_range(enqueue_run.priority, 'priority', -1000, 1000);
        PERFORM runrow._require_key(enqueue_run.fairness_key, 'fairness_key');
        PERFORM runrow._require_key(enqueue_run.concurrency_key, 'concurrency_key');
        PERFORM runrow._require_key(enqueue_run.rate_limit_key, 'rate_limit_key');
    END IF;
    IF enqueue_run.token_budget <= 0 THEN
        RAISE EXCEPTION 'token_budget must be NULL or a positive number of tokens, got %', enqueue_run.token_budget
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- NaN sorts above every number (NaN > 0): >= 'Infinity' refuses it, and Infinity.
    IF enqueue_run.cost_budget <= 0 OR enqueue_run.cost_budget >= 'Infinity' THEN
        RAISE EXCEPTION 'cost_budget must be NULL or a finite, positive amount of USD, got %', enqueue_run.cost_budget
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The identifiers operators read back hold no control character (a line break forged a log
    -- line, a bidirectional override showed another tenant: functions/_identifier_checks.sql).
    -- One test of all seven; the helper, in the arguments' order, only when one fails. The
    -- only test of them an enqueue makes: agent_run's settings trigger leaves a new run's to
    -- this one (it tests an UPDATE's, a retry's and a fork's).
    IF (runrow._printable(enqueue_run.model) AND runrow._printable(enqueue_run.user_id)
        AND runrow._printable(enqueue_run.idempotency_key) AND runrow._printable(enqueue_run.fairness_key)
        AND runrow._printable(enqueue_run.concurrency_key) AND runrow._printable(enqueue_run.rate_limit_key)
        AND runrow._printable(enqueue_run.webhook_url)) IS FALSE THEN
        PERFORM runrow._require_printable(enqueue_run.model, 'model');
        PERFORM runrow._require_printable(enqueue_run.user_id, 'user_id');
        PERFORM runrow._require_printable(enqueue_run.idempotency_key, 'idempotency_key');
        PERFORM runrow._require_printable(enqueue_run.fairness_key, 'fairness_key');
        PERFORM runrow._require_printable(enqueue_run.concurrency_key, 'concurrency_key');
        PERFORM runrow._require_printable(enqueue_run.rate_limit_key, 'rate_limit_key');
        PERFORM runrow._require_printable(enqueue_run.webhook_url, 'webhook_url');
    END IF;
    -- A URL no request can be sent to (no host, a port past 65535 or not a number, an unclosed
    -- IPv6 bracket) failed every delivery attempt the same way, long after the enqueue said 202.
    IF NOT runrow._webhook_url_ok(enqueue_run.webhook_url) THEN
        RAISE EXCEPTION 'webhook_url must be NULL or an http:// or https:// URL of at most 2048 characters with a '
            'host, and a port from 1 to 65535 if it names one, got "%"', left(enqueue_run.webhook_url, 80)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Pinned before anything else is locked or written: a new prompt's tools are checked in full
    -- there (_require_tools), and their error must come before a reject's 55000 or an
    -- interrupt's wait for the active runs' locks.
    prompt_id := runrow._pin_prompt(enqueue_run.system_prompt, enqueue_run.tools);

    -- One enqueue at a time per conversation, so reject/interrupt see a stable set of
    -- active runs, and per idempotency key, so a double POST finds the first run.
    PERFORM runrow._lock_conversation(enqueue_run.conversation_id);
    IF enqueue_run.idempotency_key IS NOT NULL THEN
        -- The request as the caller made it; jsonb's text is canonical (key order and
        -- whitespace do not count), so a retry of the same request has the same print.
        fingerprint := encode(sha256(convert_to((jsonb_build_object(
            'conversation_id', enqueue_run.conversation_id, 'user_id', enqueue_run.user_id,
            'content', enqueue_run.content, 'model', enqueue_run.model,
            'system_prompt', enqueue_run.system_prompt, 'tools', enqueue_run.tools,
            'max_attempts', enqueue_run.max_attempts, 'if_active', enqueue_run.if_active,
            -- The caller's trace context is not part of the request: a client that retries
            -- with the same key from a new span gets the first run, not a 23505.
            'metadata', enqueue_run.metadata - 'traceparent')
            -- The fleet arguments count only when given, so a request that names none has
            -- the print it had before they existed (a replay across the upgrade still replays).
            || jsonb_strip_nulls(jsonb_build_object(
                'start_in', enqueue_run.start_in::text,
                'priority', nullif(enqueue_run.priority, 0),
                'fairness_key', enqueue_run.fairness_key,
                'concurrency_key', enqueue_run.concurrency_key,
                'rate_limit_key', enqueue_run.rate_limit_key,
                'token_budget', enqueue_run.token_budget,
                'cost_budget', enqueue_run.cost_budget,
                'webhook_url', enqueue_run.webhook_url)))::text, 'UTF8')), 'hex');
        PERFORM pg_advisory_xact_lock(7142, hashtext(enqueue_run.idempotency_key));
        SELECT r.* INTO existing FROM runrow.agent_run AS r
        WHERE r.idempotency_key = enqueue_run.idempotency_key;
        IF FOUND THEN
            -- 23505: the key is unique (agent_run_idempotency_key) and already taken by
            -- another request. Replaying the first run would hide that this one never ran.
            IF existing.conversation_id <> enqueue_run.conversation_id
               OR existing.user_id IS DISTINCT FROM enqueue_run.user_id THEN
                RAISE EXCEPTION 'idempotency_key "%" is already used by a run of another conversation or user',
                    enqueue_run.idempotency_key
                    USING ERRCODE = 'unique_violation', CONSTRAINT = 'agent_run_idempotency_key';
            END IF;
            -- (NULL: enqueued before migration 0010, nothing to compare; it replays.)
            IF existing.request_fingerprint <> fingerprint THEN
                RAISE EXCEPTION 'idempotency_key "%" is already used by a different request (run %)',
                    enqueue_run.idempotency_key, existing.id
                    USING ERRCODE = 'unique_violation', CONSTRAINT = 'agent_run_idempotency_key',
                          HINT = 'A replay must repeat content, model, system_prompt, tools, max_attempts, '
                                 'if_active and metadata exactly; a new request needs a new key.';
            END IF;
            RETURN QUERY SELECT existing.id, existing.status, false;
            RETURN;
        END IF;
    END IF;

    -- The first enqueue creates the conversation and makes its user the owner; nobody
    -- else can add a turn to it (42501, which the HTTP service answers as 404).
    INSERT INTO runrow.conversation AS c (id, user_id)
    VALUES (enqueue_run.conversation_id, enqueue_run.user_id)
    ON CONFLICT ON CONSTRAINT conversation_pkey DO NOTHING;
    IF (SELECT c.user_id FROM runrow.conversation AS c WHERE c.id = enqueue_run.conversation_id)
       IS DISTINCT FROM enqueue_run.user_id THEN
        RAISE EXCEPTION 'conversation_id % belongs to another user', enqueue_run.conversation_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;

    -- An open turn: an active one (agent_run_one_active_per_conversation) or a queued one
    -- (agent_run_queued_by_conversation).
    IF EXISTS (
        SELECT 1 FROM runrow.agent_run AS r
        WHERE r.conversation_id = enqueue_run.conversation_id
          AND r.status IN ('running', 'waiting')
    ) OR EXISTS (
        SELECT 1 FROM runrow.agent_run AS r
        WHERE r.conversation_id = enqueue_run.conversation_id
          AND r.status = 'queued'
    ) THEN
        IF enqueue_run.if_active = 'reject' THEN
            RAISE EXCEPTION 'conversation % already has an active run (if_active = reject)', enqueue_run.conversation_id
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Wait for it to end, stop it, or enqueue with if_active => ''interrupt''.';
        ELSIF enqueue_run.if_active = 'interrupt' THEN
            PERFORM runrow.stop_conversation(enqueue_run.conversation_id);
        END IF;
    END IF;

    INSERT INTO runrow.message (conversation_id, user_id, content)
    VALUES (enqueue_run.conversation_id, enqueue_run.user_id, enqueue_run.content)
    RETURNING id INTO new_message_id;

    INSERT INTO runrow.agent_run (
        conversation_id, user_id, user_message_id, max_attempts, model, prompt_id,
        idempotency_key, request_fingerprint, metadata,
        not_before, priority, fairness_key, concurrency_key, rate_limit_key,
        token_budget, cost_budget, webhook_url
    )
    VALUES (
        enqueue_run.conversation_id, enqueue_run.user_id, new_message_id, enqueue_run.max_attempts,
        enqueue_run.model, prompt_id, enqueue_run.idempotency_key, fingerprint, enqueue_run.metadata,
        now() + enqueue_run.start_in, enqueue_run.priority,
        coalesce(enqueue_run.fairness_key, enqueue_run.user_id), enqueue_run.concurrency_key,
        coalesce(enqueue_run.rate_limit_key, enqueue_run.model),
        enqueue_run.token_budget, enqueue_run.cost_budget, enqueue_run.webhook_url
    )
    RETURNING id INTO new_run_id;

    -- The PII copy trim_journal drops, in a table of its own so agent_run's row versions do
    -- not carry the message (migration 0061).
    INSERT INTO runrow.run_request (run_id, snapshot)
    VALUES (new_run_id, jsonb_build_object('content', enqueue_run.content, 'metadata', enqueue_run.metadata));

    -- An assignment, not a PERFORM: a call in an expression that reads no table is evaluated
    -- without a statement of its own (issue 11).
    journaled := runrow._journal(new_run_id, jsonb_build_array(
        jsonb_build_object('type', 'user_message_created', 'message_id', new_message_id),
        jsonb_build_object('type', 'run_queued', 'run_id', new_run_id)
        || jsonb_strip_nulls(jsonb_build_object('not_before', now() + enqueue_run.start_in))
    ));
    -- A delayed run is nobody's to claim yet: waking the fleet now would only cost a
    -- notifying commit and an empty claim on every worker. Workers find it by their poll.
    IF enqueue_run.start_in IS NULL THEN
        PERFORM runrow._wake_dispatchers(enqueue_run.conversation_id);
    END IF;

    -- OUT values and RETURN NEXT: no statement for a row of values (issue 11).
    run_id := new_run_id;
    status := 'queued';
    created := true;
    RETURN NEXT;
END
$fn$;

COMMENT ON FUNCTION runrow.enqueue_run(
    uuid, jsonb, text, text, text, jsonb, integer, text, text, jsonb,
    interval, integer, text, text, text, bigint, numeric, text
) IS
'Enqueue one turn of a conversation. In one transaction: the user message, the run '
'(queued, pinned to model and to a content-addressed prompt of system_prompt + tools), '
'its journal events user_message_created and run_queued, and a NOTIFY on runrow_enqueued. '
'The same idempotency_key with the same request (conversation, user, content, model, '
'system_prompt, tools, max_attempts, if_active, metadata but its traceparent; JSON compared as jsonb, so key order '
'and whitespace do not count) returns the first run with created = false and writes nothing; '
'the key with any other request raises 23505 (unique_violation, constraint '
'agent_run_idempotency_key) naming idempotency_key, and writes nothing. A run enqueued '
'before migration 0010 has no fingerprint: its key replays whatever the request. When the '
'conversation has an active (queued, running or waiting) run, if_active decides: enqueue '
'(wait behind it), reject (error 55000, nothing written) or interrupt (stop the active runs '
'as stop_conversation does, then enqueue, atomically). Bad input raises 22004/22023 naming '
'the argument (content blocks and tool definitions the Messages API refuses, see '
'functions/_request_checks.sql; metadata, content and tools that nest 100 levels or hold a number '
'beyond a double''s range, which JSON clients cannot read back; metadata over 1 MiB; '
'metadata.prompt_cache, when given, must be "off", "5m" or "1h"; '
'metadata.traceparent a W3C traceparent: the trace every attempt of the run continues, left '
'out of the idempotency fingerprint). The first '
'enqueue of a conversation makes user_id its owner; another user''s '
'enqueue into it raises 42501. Fleet arguments (SPEC "Fleet scheduling"), stored on the run: '
'start_in (not claimable before now() + start_in, database clock, which must land after now() '
'and at most 366 days out on the calendar; no wake is sent), priority '
'(-1000..1000, higher first), fairness_key (default user_id), concurrency_key, rate_limit_key '
'(default model), token_budget, cost_budget (USD) and webhook_url; they join the idempotency '
'fingerprint only when given. model, user_id, idempotency_key, fairness_key, concurrency_key, '
'rate_limit_key and webhook_url holding a control character (C0, C1 or bidirectional '
'formatting: _printable) raise 22023 naming the argument.';

REVOKE ALL ON FUNCTION runrow.enqueue_run(
    uuid, jsonb, text, text, text, jsonb, integer, text, text, jsonb,
    interval, integer, text, text, text, bigint, numeric, text
) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.enqueue_run(
    uuid, jsonb, text, text, text, jsonb, integer, text, text, jsonb,
    interval, integer, text, text, text, bigint, numeric, text
)
TO runrow_client;
