-- A schedule's name is typed back to drop it: no control character (_printable: a line break broke
-- `runrow schedules`' table, a bidirectional override showed another name) and no white space at either end (_white_space: such a name could not be
-- typed back). create_schedule's rule and the table's (trigger schedule_name_printable, migration
-- 0081; a CHECK from 0067 to 0081). Here, not in a migration, since migration 0081: the trigger
-- looks it up when it fires.
CREATE OR REPLACE FUNCTION runrow._schedule_name_ok(name text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT runrow._printable(name) AND btrim(name, runrow._white_space()) = name
$fn$;

COMMENT ON FUNCTION runrow._schedule_name_ok(text) IS
'Private. TRUE when a schedule name holds no control character (_printable: C0, C1 or '
'bidirectional formatting) and no white space '
'(_white_space, Unicode''s) at either end: create_schedule''s rule and the table''s trigger '
'schedule_name_printable. Inlined.';

REVOKE ALL ON FUNCTION runrow._schedule_name_ok(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION runrow.create_schedule(
    name text,
    cron text,
    content jsonb,
    model text,
    conversation_id uuid DEFAULT NULL,
    user_id text DEFAULT NULL,
    system_prompt text DEFAULT NULL,
    tools jsonb DEFAULT '[]',
    metadata jsonb DEFAULT '{}',
    max_attempts integer DEFAULT 1,
    if_active text DEFAULT 'enqueue',
    catch_up text DEFAULT 'latest',
    max_catch_up integer DEFAULT NULL,
    priority integer DEFAULT 0,
    fairness_key text DEFAULT NULL,
    concurrency_key text DEFAULT NULL
)
RETURNS uuid
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    spec runrow.cron_spec;
    first_tick timestamptz;
    cap integer;
    new_id uuid;
BEGIN
    -- Validate everything before writing anything; the template gets enqueue_run's checks
    -- here, so a bad template fails now and not at every tick.
    PERFORM runrow._require_not_null(create_schedule.name, 'name');
    IF btrim(create_schedule.name, runrow._white_space()) = '' OR length(create_schedule.name) > 200 THEN
        RAISE EXCEPTION 'name must be 1 to 200 characters, not blank' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The name is typed back to drop the schedule: one with a line break broke `runrow
    -- schedules`' table, and one with a space around it could not be named to drop it.
    IF NOT runrow._schedule_name_ok(create_schedule.name) THEN
        -- A control character is named by its code point: quoted, it would reach the log.
        PERFORM runrow._require_printable(create_schedule.name, 'name');
        RAISE EXCEPTION 'name must not begin or end with white space, got "%"', left(create_schedule.name, 200)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Kept and shown by `runrow schedules`, and quoted by the parser's errors: a line break
    -- split into fields like a space ("0\n3 * * *" was stored as given).
    PERFORM runrow._require_printable(create_schedule.cron, 'cron');
    spec := runrow._cron_parse(create_schedule.cron);
    first_tick := runrow._cron_next(spec, now());
    IF first_tick IS NULL THEN
        RAISE EXCEPTION 'cron "%" never fires (no matching minute in the next ten years)', create_schedule.cron
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM runrow._require_content(create_schedule.content);
    IF octet_length(create_schedule.content::text) > 1048576 THEN
        RAISE EXCEPTION 'content is too large: the limit is 1 MiB' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM runrow._require_not_null(create_schedule.model, 'model');
    IF create_schedule.model = '' OR length(create_schedule.model) > 200 THEN
        RAISE EXCEPTION 'model must be a non-empty model name of at most 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT runrow._model_trimmed(create_schedule.model) THEN
        PERFORM runrow._require_model_trimmed(create_schedule.model);
    END IF;
    IF create_schedule.user_id = '' OR length(create_schedule.user_id) > 200 THEN
        RAISE EXCEPTION 'user_id must be NULL or 1 to 200 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(create_schedule.system_prompt) > 1048576 THEN
        RAISE EXCEPTION 'system_prompt is too large: the limit is 1 MiB' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM runrow._require_tools(create_schedule.tools);
    IF octet_length(create_schedule.tools::text) > 1048576 THEN
        RAISE EXCEPTION 'tools is too large: the limit is 1 MiB' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM runrow._require_metadata(create_schedule.metadata);
    PERFORM runrow._require_range(create_schedule.max_attempts, 'max_attempts', 1, 100);
    PERFORM runrow._require_not_null(create_schedule.if_active, 'if_active');
    IF create_schedule.if_active NOT IN ('enqueue', 'reject', 'interrupt') THEN
        -- Quoted below: a control character would reach the log through the error.
        PERFORM runrow._require_printable(create_schedule.if_active, 'if_active');
        RAISE EXCEPTION 'if_active must be one of enqueue, reject, interrupt, got "%"', left(create_schedule.if_active, 80)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Without a fixed conversation every tick opens a new one, which has no active run: reject
    -- and interrupt would never act, and whoever asked for them meant a conversation.
    IF create_schedule.if_active <> 'enqueue' AND create_schedule.conversation_id IS NULL THEN
        RAISE EXCEPTION 'if_active % needs a conversation_id: without one every tick opens a new conversation, '
            'which has no active run to %', create_schedule.if_active, create_schedule.if_active
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM runrow._require_not_null(create_schedule.catch_up, 'catch_up');
    IF create_schedule.catch_up NOT IN ('latest', 'each') THEN
        -- Quoted below: a control character would reach the log through the error.
        PERFORM runrow._require_printable(create_schedule.catch_up, 'catch_up');
        RAISE EXCEPTION 'catch_up must be latest (after an outage, only the most recent missed tick) '
            'or each (every missed tick, up to max_catch_up), got "%"', left(create_schedule.catch_up, 80)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Each missed tick would stop the one before it: after a 5-minute outage a * * * * *
    -- schedule enqueued 5 runs and cancelled 4, each paying for a stop. Only the last ran.
    IF create_schedule.catch_up = 'each' AND create_schedule.if_active = 'interrupt' THEN
        RAISE EXCEPTION 'catch_up each cannot go with if_active interrupt: after an outage every missed tick '
            'would be enqueued and stop the one before it, so all but the last would be cancelled; use '
            'catch_up latest (only the most recent missed tick)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF create_schedule.catch_up = 'latest' THEN
        IF coalesce(create_schedule.max_catch_up, 1) <> 1 THEN
            RAISE EXCEPTION 'max_catch_up must be NULL or 1 with catch_up latest, got %', create_schedule.max_catch_up
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        cap := 1;
    ELSE
        cap := coalesce(create_schedule.max_catch_up, 10);
        PERFORM runrow._require_range(cap, 'max_catch_up', 1, 1000);
    END IF;
    PERFORM runrow._require_range(create_schedule.priority, 'priority', -1000, 1000);
    PERFORM runrow._require_key(create_schedule.fairness_key, 'fairness_key');
    PERFORM runrow._require_key(create_schedule.concurrency_key, 'concurrency_key');
    -- The template's identifiers, as enqueue_run's (functions/_identifier_checks.sql): refused
    -- now, not at every tick.
    PERFORM runrow._require_printable(create_schedule.model, 'model');
    PERFORM runrow._require_printable(create_schedule.user_id, 'user_id');
    PERFORM runrow._require_printable(create_schedule.fairness_key, 'fairness_key');
    PERFORM runrow._require_printable(create_schedule.concurrency_key, 'concurrency_key');
    -- Pinned now, so that firing passes only read it: two passes that each inserted a new
    -- prompt row waited on each other's (and deadlocked when their schedules crossed).
    PERFORM runrow._pin_prompt(create_schedule.system_prompt, create_schedule.tools);
    -- A fixed conversation someone else owns would make every tick fail: say so now.
    IF create_schedule.conversation_id IS NOT NULL AND EXISTS (
        SELECT 1 FROM runrow.conversation AS c
        WHERE c.id = create_schedule.conversation_id AND c.user_id IS DISTINCT FROM create_schedule.user_id
    ) THEN
        RAISE EXCEPTION 'conversation_id % belongs to another user', create_schedule.conversation_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;

    INSERT INTO runrow.schedule AS s (
        name, cron, conversation_id, content, model, user_id, system_prompt, tools, metadata,
        max_attempts, if_active, priority, fairness_key, concurrency_key, catch_up, max_catch_up, next_fire_at
    )
    VALUES (
        create_schedule.name, create_schedule.cron, create_schedule.conversation_id, create_schedule.content,
        create_schedule.model, create_schedule.user_id, create_schedule.system_prompt, create_schedule.tools,
        create_schedule.metadata, create_schedule.max_attempts, create_schedule.if_active,
        create_schedule.priority, create_schedule.fairness_key, create_schedule.concurrency_key,
        create_schedule.catch_up, cap, first_tick
    )
    ON CONFLICT ON CONSTRAINT schedule_name_key DO NOTHING
    RETURNING s.id INTO new_id;
    IF new_id IS NULL THEN
        RAISE EXCEPTION 'name "%" is already taken by another schedule', create_schedule.name
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'schedule_name_key',
                  HINT = 'Drop it first (drop_schedule) or choose another name.';
    END IF;
    RETURN new_id;
END
$fn$;

COMMENT ON FUNCTION runrow.create_schedule(
    text, text, jsonb, text, uuid, text, text, jsonb, jsonb, integer, text, text, integer, integer, text, text
) IS
'Create a recurring run named `name`: at every tick of `cron` (five fields, UTC, Vixie syntax: '
'*, lists, ranges, steps, month and weekday names, 7 = Sunday, the day-of-month/day-of-week OR '
'rule, and @hourly/@daily/@weekly/@monthly/@yearly) a reaper pass enqueues the template with '
'enqueue_run: content, model, user_id, system_prompt, tools, metadata, max_attempts, if_active, '
'priority, fairness_key, concurrency_key, '
'into conversation_id, or into a new conversation per tick when it is NULL. catch_up says what '
'a pass does with ticks missed during an outage: latest (the default) enqueues only the most '
'recent, each enqueues every one, but at most max_catch_up (default 10, 1 to 1000) of the most '
'recent. The first tick is the first after now(). Returns the schedule id. Bad input raises '
'22004/22023 naming the argument (a cron that cannot parse or never fires names cron; catch_up '
'each with if_active interrupt names catch_up: every missed tick would stop the one before; a name, '
'model, user_id, fairness_key or concurrency_key holding a control character, C0, C1 or '
'bidirectional formatting, names it), a taken '
'name raises 23505 (constraint schedule_name_key), a fixed conversation of another user 42501; '
'nothing is written.';

REVOKE ALL ON FUNCTION runrow.create_schedule(
    text, text, jsonb, text, uuid, text, text, jsonb, jsonb, integer, text, text, integer, integer, text, text
) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.create_schedule(
    text, text, jsonb, text, uuid, text, text, jsonb, jsonb, integer, text, text, integer, integer, text, text
) TO runrow_client;
