-- Private helpers shared by the public functions. Not granted to any role: only the
-- SECURITY DEFINER functions (running as the owner) call them.
-- They run under their callers' pinned search_path, so none carries a SET clause of its own: a
-- SET is a settings save and restore on every call, about half of what calling a small helper
-- costs (issue 11).

-- Content address of a prompt: hex SHA-256 of the jsonb text of {"system", "tools"}.
-- jsonb's text form is canonical (sorted keys, fixed spacing), so equal prompts share
-- an id whatever key order or whitespace the caller used.
CREATE OR REPLACE FUNCTION runrow._pin_prompt(system_prompt text, tools jsonb)
RETURNS text
LANGUAGE plpgsql
AS $fn$
DECLARE
    pid text := encode(sha256(convert_to(
        jsonb_build_object('system', _pin_prompt.system_prompt, 'tools', _pin_prompt.tools)::text,
        'UTF8')), 'hex');
BEGIN
    -- Most enqueues pin a prompt that exists (an application's runs share a few): looked up
    -- first, because an INSERT ... ON CONFLICT DO NOTHING evaluates the table's CHECKs before
    -- it finds the conflict, prompt_id_check's regular expression among them (about a tenth of
    -- an enqueue's backend work, issue 11). The INSERT stays for a new one, or a race.
    IF EXISTS (SELECT 1 FROM runrow.prompt AS p WHERE p.id = pid) THEN
        RETURN pid;
    END IF;
    -- A new prompt: its tools are checked in full here, once, not on every enqueue that pins it
    -- (no tools, nothing to check: no statement).
    IF _pin_prompt.tools <> '[]' THEN
        PERFORM runrow._require_tools(_pin_prompt.tools);
    END IF;
    INSERT INTO runrow.prompt AS p (id, system_prompt, tools)
    VALUES (pid, _pin_prompt.system_prompt, _pin_prompt.tools)
    ON CONFLICT ON CONSTRAINT prompt_pkey DO NOTHING;
    RETURN pid;
END
$fn$;

-- Serialize everything that must see a conversation's runs as one set (enqueue's
-- reject/interrupt, stop). Two-key form: namespace 7141 = runrow conversations.
-- SQL without a SET clause, so a caller's PERFORM of it is inlined into one statement (as
-- PL/pgSQL it was a function call and a PERFORM of its own: issue 11).
CREATE OR REPLACE FUNCTION runrow._lock_conversation(conversation_id uuid)
RETURNS void
LANGUAGE sql
AS $fn$
    SELECT pg_advisory_xact_lock(7141, hashtext(_lock_conversation.conversation_id::text));
$fn$;

-- _lock_conversation's lock if it is free now, else false at once (the same key): for the
-- schedule firing, which must never wait on a conversation a client or another pass holds.
CREATE OR REPLACE FUNCTION runrow._try_lock_conversation(conversation_id uuid)
RETURNS boolean
LANGUAGE sql
AS $fn$
    SELECT pg_try_advisory_xact_lock(7141, hashtext(_try_lock_conversation.conversation_id::text));
$fn$;

-- Append events to a run's journal at the next seqs. The caller must hold the run
-- row's lock (every journal writer does), which makes it the single writer of seq.
-- Returns the last seq written. Does not notify: callers wake tails once per call.
CREATE OR REPLACE FUNCTION runrow._journal(run_id uuid, events jsonb)
RETURNS bigint
LANGUAGE plpgsql
AS $fn$
DECLARE
    last_seq bigint;
BEGIN
    -- seq left NULL: the guard trigger assigns each row the next one, in this order, with
    -- the one lookup of the run's last seq a row needs (reading it here too doubled that).
    WITH journaled AS (
        INSERT INTO runrow.run_event (run_id, seq, type, payload)
        SELECT _journal.run_id, NULL, x.ev ->> 'type', x.ev
        FROM jsonb_array_elements(_journal.events) WITH ORDINALITY AS x (ev, ord)
        ORDER BY x.ord
        RETURNING run_event.seq
    )
    SELECT max(j.seq) INTO last_seq FROM journaled AS j;

    -- Nothing to append (no caller does that): the last seq is the run's current one.
    IF last_seq IS NULL THEN
        SELECT coalesce(max(e.seq), 0) INTO last_seq
        FROM runrow.run_event AS e WHERE e.run_id = _journal.run_id;
    END IF;
    RETURN last_seq;
END
$fn$;

COMMENT ON FUNCTION runrow._journal(uuid, jsonb) IS
'Private: append a JSON array of event objects to the run''s journal at its next seqs (assigned '
'by the run_event guard trigger, in array order) and return the last seq written (the run''s '
'current last seq when the array is empty). The caller holds the run row''s lock, which makes it '
'the single writer of the run''s seqs, and wakes the tails itself.';

CREATE OR REPLACE FUNCTION runrow._wake_tails(run_id uuid, last_seq bigint)
RETURNS void
LANGUAGE plpgsql
AS $fn$
BEGIN
    -- Only a run some tail watches (migration 0025): the caller holds the run's row lock
    -- and this is a statement after it, so a watch registered before the lock is seen here,
    -- and one registered after waits for our commit and then reads what we wrote. A
    -- REPEATABLE READ snapshot could predate a watch: notify then regardless.
    IF current_setting('transaction_isolation') <> 'read committed' OR EXISTS (
        SELECT 1 FROM runrow.run_watch AS w
        WHERE w.run_id = _wake_tails.run_id AND w.expires_at > now()
    ) THEN
        PERFORM pg_notify(runrow.events_channel(_wake_tails.run_id), _wake_tails.last_seq::text);
    END IF;
END
$fn$;

-- A run's ending: wake its tails (if any watches it) with the seq of its complete event,
-- and drop its watches, which no later write of the run needs.
CREATE OR REPLACE FUNCTION runrow._wake_tails_ended(run_id uuid, last_seq bigint)
RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    watched boolean;
BEGIN
    WITH gone AS (
        DELETE FROM runrow.run_watch AS w WHERE w.run_id = _wake_tails_ended.run_id
        RETURNING w.expires_at
    )
    SELECT bool_or(g.expires_at > now()) INTO watched FROM gone AS g;
    IF watched OR current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify(runrow.events_channel(_wake_tails_ended.run_id), _wake_tails_ended.last_seq::text);
    END IF;
END
$fn$;

-- A batch of endings (finish_runs, finish_and_claim_runs): each run's tails woken once with
-- the seq of its complete event if a tail watches it, and its watches dropped.
CREATE OR REPLACE FUNCTION runrow._wake_tails_ended_batch(run_ids uuid[], last_seqs bigint[])
RETURNS void
LANGUAGE plpgsql
-- No SET: called only by functions that pin the search_path, once per batch.
AS $fn$
DECLARE
    watched_ids uuid[];
BEGIN
    WITH gone AS (
        DELETE FROM runrow.run_watch AS w WHERE w.run_id = ANY (_wake_tails_ended_batch.run_ids)
        RETURNING w.run_id, w.expires_at
    )
    SELECT array_agg(g.run_id) INTO watched_ids FROM gone AS g WHERE g.expires_at > now();
    PERFORM pg_notify(runrow.events_channel(d.id), d.seq::text)
    FROM unnest(_wake_tails_ended_batch.run_ids, _wake_tails_ended_batch.last_seqs) AS d (id, seq)
    WHERE current_setting('transaction_isolation') <> 'read committed' OR d.id = ANY (watched_ids);
END
$fn$;

-- Dispatchers LISTEN on runrow_enqueued; the payload is the conversation whose turn
-- became claimable. Sent on enqueue and requeue; on an ending, the triggers send it when the
-- ending lets something start (migration 0025).
-- SQL without a SET clause, so a caller's PERFORM of it is inlined into one statement.
CREATE OR REPLACE FUNCTION runrow._wake_dispatchers(conversation_id uuid)
RETURNS void
LANGUAGE sql
AS $fn$
    SELECT pg_notify('runrow_enqueued', _wake_dispatchers.conversation_id::text);
$fn$;

-- The terminal tail of every ending (finish, reap, release, stop, cancel): journal the
-- one `complete` event and wake the run's tails. The caller has already made the fenced
-- status write, whose triggers woke the dispatchers if the ending lets a run start.
CREATE OR REPLACE FUNCTION runrow._journal_complete(
    run_id uuid, conversation_id uuid, status text, result jsonb, error text
)
RETURNS bigint
LANGUAGE plpgsql
AS $fn$
DECLARE
    last_seq bigint;
BEGIN
    last_seq := runrow._journal(_journal_complete.run_id, jsonb_build_array(jsonb_build_object(
        'type', 'complete',
        'status', _journal_complete.status,
        'result', _journal_complete.result,
        'error', _journal_complete.error)));
    -- The wake, with its DELETE of the run's watches, only when the run has a watch (as
    -- finish_runs: a probe of run_watch's key is cheaper than a DELETE that finds nothing, and
    -- nearly every ending has no tail). Any watch, expired or not, so that the helper still drops
    -- the expired ones; under a snapshot older than the statement (not READ COMMITTED) it is
    -- called regardless, as it notifies regardless there.
    IF current_setting('transaction_isolation') <> 'read committed'
       OR EXISTS (SELECT 1 FROM runrow.run_watch AS w WHERE w.run_id = _journal_complete.run_id) THEN
        PERFORM runrow._wake_tails_ended(_journal_complete.run_id, last_seq);
    END IF;
    RETURN last_seq;
END
$fn$;

-- The fence every worker write passes: the run is still running with this claim token,
-- checked under the run row's lock (FOR NO KEY UPDATE), so a reaper, stop or finish that
-- got there first has already changed status or cleared the token. Holding that lock also
-- makes the caller the single writer of the run's journal and step seqs until it commits.
CREATE OR REPLACE FUNCTION runrow._hold_claim(run_id uuid, claim_token uuid)
RETURNS boolean
LANGUAGE plpgsql
AS $fn$
BEGIN
    PERFORM 1 FROM runrow.agent_run AS r
    -- By primary key and token only, as heartbeat (a token means running: agent_run_state).
    WHERE r.id = _hold_claim.run_id
      AND r.claim_token = _hold_claim.claim_token
    FOR NO KEY UPDATE;
    RETURN FOUND;
END
$fn$;

-- Bad-input helpers: every error names the argument, with a standard SQLSTATE. Callers test
-- first and call one only to raise where they run often (a PERFORM is a statement).
CREATE OR REPLACE FUNCTION runrow._require_not_null(value anyelement, arg text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $fn$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', arg USING ERRCODE = 'null_value_not_allowed';
    END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION runrow._require_range(value bigint, arg text, lo bigint, hi bigint)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $fn$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', arg USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF value < lo OR value > hi THEN
        RAISE EXCEPTION '% must be between % and %, got %', arg, lo, hi, value
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

-- An optional delay: NULL (none) or more than zero and at most hi. A zero or negative delay is
-- a caller's mistake (it would read as "later" and mean "now"), not a request to run at once.
-- Judged where it lands, now() + value, as the caller's not_before is: interval comparison
-- counts a month as 30 days and a year as 360, so '1 mon -29 days -23 hours' compared as under
-- a day and landed 1 day 00:59:59 out, and '-1 year 361 days' compared as a day and landed in
-- the past (the SQL audit). At most hi means no later than now() + hi on the calendar or hi
-- of elapsed time, whichever is later: '1 day' and '24 hours' both pass across a change of
-- daylight saving time. An interval that lands beyond timestamptz's range is out of range too.
CREATE OR REPLACE FUNCTION runrow._require_delay(value interval, arg text, hi interval)
RETURNS void
LANGUAGE plpgsql
STABLE
AS $fn$
DECLARE
    lands timestamptz;
BEGIN
    IF value IS NULL THEN
        RETURN;
    END IF;
    BEGIN
        lands := now() + value;
    EXCEPTION WHEN datetime_field_overflow THEN
        lands := NULL;
    END;
    IF lands IS NULL OR lands <= now() OR (lands > now() + hi AND lands - now() > hi) THEN
        RAISE EXCEPTION '% must be NULL or more than 0 and at most %, got %', arg, hi, value
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

-- TRUE when value is NULL or a delay that certainly passes _require_delay: a time of day only
-- (no days, months or years, which a calendar lengthens or shortens), more than 0 and at most
-- hi. What clients send (make_interval(secs => ...), '90 seconds'); FALSE asks the helper,
-- which may still accept it. One expression, inlined into the caller's IF: no call.
CREATE OR REPLACE FUNCTION runrow._delay_plain(value interval, hi interval)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT value IS NULL OR (
        value > interval '0' AND value <= hi
        AND date_part('day', value) = 0 AND date_part('month', value) = 0 AND date_part('year', value) = 0
    )
$fn$;

-- An optional key naming a tenant or a limit: NULL or 1 to 200 characters.
CREATE OR REPLACE FUNCTION runrow._require_key(value text, arg text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $fn$
BEGIN
    IF value = '' OR length(value) > 200 THEN
        RAISE EXCEPTION '% must be NULL or 1 to 200 characters', arg
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

-- A tool call's key as runrow.tool_call_key makes it: 64 lowercase hex digits. Tested without
-- the regular expression engine (^[0-9a-f]{64}$ cost about 90,000 instructions a match), and as
-- an SQL function of one expression, which the planner inlines into the caller's IF: no call.
CREATE OR REPLACE FUNCTION runrow._is_tool_call_key(key text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT length(key) = 64 AND ltrim(key, '0123456789abcdef') = ''
$fn$;

REVOKE ALL ON FUNCTION runrow._pin_prompt(text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._is_tool_call_key(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._lock_conversation(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._try_lock_conversation(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._journal(uuid, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._hold_claim(uuid, uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._wake_tails(uuid, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._wake_tails_ended(uuid, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._wake_tails_ended_batch(uuid[], bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._wake_dispatchers(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._journal_complete(uuid, uuid, text, jsonb, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._require_not_null(anyelement, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._require_range(bigint, text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._require_delay(interval, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._delay_plain(interval, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._require_key(text, text) FROM PUBLIC;
