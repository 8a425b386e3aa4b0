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
-- seq. The walk goes back from the journal's end and stops at the first committed event, or at
-- a `superseded` (what is before it was taken back already, or kept: its after_seq is A), so
-- it reads one turn's events, not the run's whole journal.
CREATE OR REPLACE FUNCTION runrow._superseded_event(run_id uuid, attempt integer)
RETURNS jsonb
LANGUAGE plpgsql
AS $fn$
DECLARE
    ev record;
    through bigint;
    kept bigint;
    first_claim bigint;
    last_delta bigint;
BEGIN
    FOR ev IN
        SELECT e.seq, e.type FROM runrow.run_event AS e
        WHERE e.run_id = _superseded_event.run_id
        ORDER BY e.seq DESC
    LOOP
        through := coalesce(through, ev.seq);
        IF ev.type IN ('model_turn', 'tool_result') THEN
            kept := ev.seq;
            EXIT;
        ELSIF ev.type = 'superseded' THEN
            SELECT (e.payload ->> 'after_seq')::bigint INTO kept
            FROM runrow.run_event AS e
            WHERE e.run_id = _superseded_event.run_id AND e.seq = ev.seq;
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
'seq of the last model_turn or tool_result (or the after_seq of the latest superseded when it '
'comes later), else the run''s first run_claimed; B the run''s last seq. NULL when no '
'text_delta, thinking_delta or input_json_delta lies in (A, B]. The caller holds the run row''s '
'lock and journals the event before the hand-back''s own.';

REVOKE ALL ON FUNCTION runrow._superseded_event(uuid, integer) FROM PUBLIC;
