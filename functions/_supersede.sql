-- What a hand-back that gives the attempt back takes back from the journal (migration 0096).
-- A resumed attempt journals `superseded` for what earlier attempts streamed and it does not
-- keep (pyworker/worker/supersede.py), and looks only when its attempt is 2 or more. A claim
-- handed back with its attempt given back (defer_run, _park_for_person) is followed by a claim
-- of the same attempt number, which does not look: the deltas of a model turn cut off by a key
-- error mid-stream (then deferred) stayed in the answer a tail or the chat page shows (the
-- worker audit: 234 characters streamed for a 210-character result). So the hand-back journals
-- it, in its own transaction, under the run row's lock the caller holds (nobody appends
-- meanwhile).
--
-- The range is the resumed attempt's: A the last committed event (model_turn, tool_result),
-- else the run's first run_claimed (a handler that starts over keeps nothing); B the run's last
-- seq. The walk goes back from the journal's end and stops at the first committed event, at a
-- `superseded` (what is before it was taken back already, or kept: its after_seq is A), or at
-- the previous hand-back's `run_requeued` (deferred: true; it dealt with what came before it,
-- so A is its seq), so it reads one turn's or one claim's events, not the run's whole journal:
-- a run deferred k times before its first turn read all its 3k events at every deferral.
-- A worker may append any `superseded` (append_events does not look inside payloads): one
-- whose after_seq is not a whole number at or before its own seq is no stop (an after_seq of
-- 1.5 made defer_run raise 22P02, and a null one left the deltas after it in the answer).
CREATE OR REPLACE FUNCTION runrow._superseded_event(run_id uuid, attempt integer)
RETURNS jsonb
LANGUAGE plpgsql
AS $fn$
DECLARE
    -- A cursor's plan is a fast-start one (the run's rows by its key, newest first), so the
    -- walk reads only what it walks; a FOR over the query was planned to read the run's whole
    -- journal and sort it, however early the loop exited. Only the payloads the walk looks
    -- at are fetched (a delta's text can be long).
    walk CURSOR FOR
        SELECT e.seq, e.type,
            CASE WHEN e.type = 'superseded' THEN e.payload -> 'after_seq' END AS after_seq,
            CASE WHEN e.type = 'run_requeued' THEN e.payload -> 'deferred' END AS deferred
        FROM runrow.run_event AS e
        WHERE e.run_id = _superseded_event.run_id
        ORDER BY e.seq DESC;
    ev record;
    through bigint;
    kept bigint;
    first_claim bigint;
    last_delta bigint;
    after_seq numeric;
BEGIN
    FOR ev IN walk LOOP
        through := coalesce(through, ev.seq);
        IF ev.type IN ('model_turn', 'tool_result') THEN
            kept := ev.seq;
            EXIT;
        ELSIF ev.type = 'superseded' AND jsonb_typeof(ev.after_seq) = 'number' THEN
            after_seq := ev.after_seq::numeric;
            IF after_seq BETWEEN 0 AND ev.seq AND after_seq = trunc(after_seq) THEN
                kept := after_seq;
                EXIT;
            END IF;
        ELSIF ev.type = 'run_requeued' AND ev.deferred = 'true'::jsonb THEN
            kept := ev.seq;
            EXIT;
        ELSIF ev.type = 'run_claimed' THEN
            first_claim := ev.seq;
        ELSIF ev.type IN ('text_delta', 'thinking_delta', 'input_json_delta') THEN
            last_delta := coalesce(last_delta, ev.seq);
        END IF;
    END LOOP;
    kept := coalesce(kept, first_claim);
    IF last_delta IS NULL OR kept IS NULL OR last_delta <= kept THEN
        RETURN NULL;  -- nothing streamed since the work kept: a clean resume
    END IF;
    RETURN jsonb_build_object(
        'type', 'superseded', 'after_seq', kept, 'through_seq', through, 'attempt', _superseded_event.attempt
    );
END
$fn$;

COMMENT ON FUNCTION runrow._superseded_event(uuid, integer) IS
'Private. The superseded event (after_seq A, through_seq B, attempt) that takes back the deltas '
'the run streamed after its work kept, for the claim of number attempt that resumes it: A the '
'seq of the last model_turn or tool_result (or, when it comes later, the after_seq of the latest '
'superseded whose after_seq is a whole number at or before its seq, or the seq of the latest '
'run_requeued with deferred = true: that hand-back dealt with what came before it), else the '
'run''s first run_claimed; B the run''s last seq. NULL when no '
'text_delta, thinking_delta or input_json_delta lies in (A, B]. The caller holds the run row''s '
'lock and journals the event before the hand-back''s own.';

REVOKE ALL ON FUNCTION runrow._superseded_event(uuid, integer) FROM PUBLIC;
