-- Private helpers of the step log and the tool calls. Not granted to any role: only the
-- SECURITY DEFINER functions (running as the owner) call them.
-- They run under their callers' pinned search_path (functions/_helpers.sql), so none carries a SET clause of its own: a
-- SET is a settings save and restore on every call, about half of what calling a small helper
-- costs (issue 11).

-- The canonical JSON text that tool_call_key hashes: object keys sorted by code point
-- (UTF-8 byte order, hence COLLATE "C"), no whitespace, strings escaped as JSON requires
-- and nothing more (non-ASCII stays as is), numbers as PostgreSQL's numeric prints them
-- (plain decimal, no exponent). Equals Python's json.dumps(v, sort_keys=True,
-- separators=(",", ":"), ensure_ascii=False) for every value whose numbers are ints or
-- floats without an exponent in their repr; pyworker/keys.py implements the rest.
-- plpgsql, not sql: a sql function cannot call itself at creation time.
CREATE OR REPLACE FUNCTION runrow._canonical_json(value jsonb)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
STRICT
AS $fn$
BEGIN
    CASE jsonb_typeof(_canonical_json.value)
        WHEN 'object' THEN
            RETURN '{' || coalesce((
                SELECT string_agg(to_json(o.k)::text || ':' || runrow._canonical_json(o.v), ',' ORDER BY o.k COLLATE "C")
                FROM jsonb_each(_canonical_json.value) AS o (k, v)
            ), '') || '}';
        WHEN 'array' THEN
            RETURN '[' || coalesce((
                SELECT string_agg(runrow._canonical_json(a.v), ',' ORDER BY a.ord)
                FROM jsonb_array_elements(_canonical_json.value) WITH ORDINALITY AS a (v, ord)
            ), '') || ']';
        ELSE
            -- A scalar's jsonb text: escaped string, numeric text, true, false, null.
            RETURN _canonical_json.value::text;
    END CASE;
END
$fn$;

-- Append one step at the next seq. The caller holds the run row's lock (append_step and
-- complete_tool_call take it with the fence), which makes it the single writer of seq.
CREATE OR REPLACE FUNCTION runrow._append_step(
    run_id uuid, kind text, payload json, request_id text, usage jsonb DEFAULT NULL, stop_reason text DEFAULT NULL
)
RETURNS integer
LANGUAGE plpgsql
AS $fn$
DECLARE
    next_seq integer;
BEGIN
    -- seq left NULL: the guard trigger gives the step the run's next one, with the one lookup of
    -- its last seq a step needs (reading it here too doubled that: migration 0051).
    INSERT INTO runrow.agent_step (run_id, seq, kind, payload, request_id, attempt, usage, stop_reason)
    SELECT _append_step.run_id, NULL::integer, _append_step.kind, _append_step.payload,
           _append_step.request_id, r.attempt, _append_step.usage, _append_step.stop_reason
    FROM runrow.agent_run AS r WHERE r.id = _append_step.run_id
    RETURNING agent_step.seq INTO next_seq;
    RETURN next_seq;
END
$fn$;

-- Copy run from_run's steps 1..up_to to to_run, verbatim and with their seqs: every column a
-- step keeps (payload bytes, so thinking signatures stay valid) and how each turn ended
-- (agent_step_ending, 0108), so that a fork (fork_run) and the retry of a fork (retry_run) resume
-- and end as the source would. One helper for both, so what a step keeps is copied by both or
-- by neither.
CREATE OR REPLACE FUNCTION runrow._copy_steps(from_run uuid, to_run uuid, up_to integer)
RETURNS void
LANGUAGE plpgsql
AS $fn$
BEGIN
    INSERT INTO runrow.agent_step (run_id, seq, kind, payload, request_id, attempt, usage, stop_reason)
    SELECT _copy_steps.to_run, s.seq, s.kind, s.payload, s.request_id, s.attempt, s.usage, s.stop_reason
    FROM runrow.agent_step AS s
    WHERE s.run_id = _copy_steps.from_run AND s.seq <= _copy_steps.up_to
    ORDER BY s.seq;
    INSERT INTO runrow.agent_step_ending (run_id, seq, stop_sequence, stop_details)
    SELECT _copy_steps.to_run, e.seq, e.stop_sequence, e.stop_details
    FROM runrow.agent_step_ending AS e
    WHERE e.run_id = _copy_steps.from_run AND e.seq <= _copy_steps.up_to;
END
$fn$;

-- End a running run whose stop was requested, where its worker must not go on: cancelled, the
-- claim cleared (the worker's next call is fenced out and it stops), complete journaled, the
-- message left submitted as for any run stopped while running. The caller holds the run row's
-- lock. For the tool calls a stop must keep from starting (_park_for_person, begin_tool_call).
-- A call of the claim granted and never settled leaves its tenant's reserved total, as at
-- finish_run (migration 0097): the claim is gone, so nothing can settle it any more (append_step
-- and record_usage are fenced out), and left, it held the tenant's other calls back until a
-- grant that had to wait pruned it. Not charged: the holder is alive (the reaper charges a dead
-- one's), and it settles a call's usage before it begins the turn's tool calls.
CREATE OR REPLACE FUNCTION runrow._end_stopped(run_id uuid, error text)
RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    r runrow.agent_run;
BEGIN
    UPDATE runrow.agent_run AS a
    SET status = 'cancelled', finished_at = now(), error = _end_stopped.error,
        claim_token = NULL, claim_expires_at = NULL, updated_at = now()
    WHERE a.id = _end_stopped.run_id
    RETURNING a.* INTO STRICT r;
    -- Only a run with a grant has one: a stop of one without pays nothing more.
    IF r.model_call_reserved IS NOT NULL THEN
        PERFORM runrow._tenant_unreserve(r.id);
    END IF;
    PERFORM runrow._journal_complete(r.id, r.conversation_id, 'cancelled', NULL, r.error);
END
$fn$;

-- Park a run on a person: waiting, claim cleared (heartbeat now says owned = false), the
-- attempt handed back (waiting on a person is not a failed attempt, and the claim after
-- the decision counts it again), approval_requested journaled, tails woken. The
-- conversation stays held: waiting is active. The caller holds the run row's lock.
-- A run whose stop was requested is not parked: nobody should be asked to approve a
-- call of a run the user stopped, so it ends cancelled here (its message stays
-- submitted, as for any run stopped while running).
-- A call of the claim granted and never settled is done with, as at a deferral (defer_run):
-- it leaves its tenant's reserved total (migration 0097; left, it held the tenant's other calls
-- back while a person decided, until a grant that had to wait pruned it) and the run's
-- model_call_reserved (the claim after the decision has this attempt number, and a reap of it
-- would charge this one's grant). Not charged: the holder is alive, and settles a call's usage
-- before it begins the turn's tool calls.
CREATE OR REPLACE FUNCTION runrow._park_for_person(run_id uuid, idempotency_key text)
RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    e runrow.tool_effect;
    r runrow.agent_run;
    last_seq bigint;
    events jsonb;
    taken_back jsonb;
    stopped boolean;
    reserved boolean;
BEGIN
    SELECT t.* INTO STRICT e FROM runrow.tool_effect AS t WHERE t.idempotency_key = _park_for_person.idempotency_key;
    SELECT a.cancel_requested, a.model_call_reserved IS NOT NULL INTO stopped, reserved
    FROM runrow.agent_run AS a WHERE a.id = _park_for_person.run_id;
    IF stopped THEN
        PERFORM runrow._end_stopped(_park_for_person.run_id, 'stopped before the tool call was approved');
        RETURN;
    END IF;
    UPDATE runrow.agent_run AS a
    SET status = 'waiting', claim_token = NULL, claim_expires_at = NULL, attempt = a.attempt - 1,
        model_call_reserved = NULL, model_call_attempt = NULL, updated_at = now()
    WHERE a.id = _park_for_person.run_id
    RETURNING a.* INTO STRICT r;
    IF reserved THEN
        PERFORM runrow._tenant_unreserve(_park_for_person.run_id);
    END IF;
    events := jsonb_build_array(jsonb_build_object(
        'type', 'approval_requested',
        'reason', e.state,
        'idempotency_key', e.idempotency_key,
        'tool', e.tool,
        'tool_use_id', e.tool_use_id,
        'args', e.args,
        'effect', e.effect));
    -- The claim after the decision has this claim's attempt number and takes nothing back: a
    -- handler parks with what it streamed committed, and if it did not, that is taken back
    -- here (functions/_supersede.sql; usually the walk stops at the model_turn a few rows up).
    taken_back := runrow._superseded_event(_park_for_person.run_id, r.attempt + 1);
    IF taken_back IS NOT NULL THEN
        events := jsonb_build_array(taken_back) || events;
    END IF;
    last_seq := runrow._journal(_park_for_person.run_id, events);
    PERFORM runrow._wake_tails(_park_for_person.run_id, last_seq);
END
$fn$;

-- What a person decided about a call, as begin_tool_call hands it to the worker.
CREATE OR REPLACE FUNCTION runrow._decision(e runrow.tool_effect)
RETURNS jsonb
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT jsonb_build_object(
        'approved', _decision.e.approved,
        'decided_by', _decision.e.decided_by,
        'note', _decision.e.decision_note,
        'decided_at', _decision.e.decided_at);
$fn$;

-- payload with each \u0000 escape read as \ufffd, for the checks and derived values that need
-- JSON operators (which raise 22P05 on \u0000). Created by migration 0010 as an SQL function
-- with a SET clause, which PostgreSQL can neither inline nor keep planned: its body was parsed
-- and planned on every call, about a third of an append_step (178 -> 121 us, issue 11).
-- PL/pgSQL evaluates the same CASE as a cached simple expression.
CREATE OR REPLACE FUNCTION runrow._json_probe(payload json)
RETURNS json
LANGUAGE plpgsql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $fn$
BEGIN
    RETURN CASE
        WHEN strpos(_json_probe.payload::text, '\u0000') = 0 THEN _json_probe.payload
        ELSE replace(replace(replace(_json_probe.payload::text, '\\', chr(1)), '\u0000', '\ufffd'), chr(1), '\\')::json
    END;
END
$fn$;

COMMENT ON FUNCTION runrow._json_probe(json) IS
'Private. payload with each \u0000 escape read as \ufffd, for the checks and derived values '
'that need JSON operators (which raise 22P05 on \u0000). The stored payload is never changed.';

COMMENT ON FUNCTION runrow._copy_steps(uuid, uuid, integer) IS
'Private. Copy from_run''s steps 1..up_to to to_run verbatim, seqs, payload bytes and every '
'column kept beside them (request_id, attempt, usage, stop_reason), with their '
'agent_step_ending rows (stop_sequence, stop_details): fork_run''s and retry_run''s one copy of a '
'fork''s given steps.';

REVOKE ALL ON FUNCTION runrow._canonical_json(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._json_probe(json) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._append_step(uuid, text, json, text, jsonb, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._copy_steps(uuid, uuid, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._end_stopped(uuid, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._park_for_person(uuid, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._decision(runrow.tool_effect) FROM PUBLIC;
