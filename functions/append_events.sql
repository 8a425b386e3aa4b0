CREATE OR REPLACE FUNCTION runrow.append_events(run_id uuid, claim_token uuid, events jsonb)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    bad record;
    last_seq bigint;
BEGIN
    -- The helpers only raise (the first failing one, in this order): called only when a test
    -- here fails, not as a statement and a search_path switch each on every call.
    IF append_events.run_id IS NULL
       OR append_events.claim_token IS NULL
       OR append_events.events IS NULL THEN
        PERFORM runrow._require_not_null(append_events.run_id, 'run_id');
        PERFORM runrow._require_not_null(append_events.claim_token, 'claim_token');
        PERFORM runrow._require_not_null(append_events.events, 'events');
    END IF;
    IF jsonb_typeof(append_events.events) <> 'array' THEN
        RAISE EXCEPTION 'events must be a JSON array of event objects, got %', jsonb_typeof(append_events.events)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_array_length(append_events.events) = 0 THEN
        RAISE EXCEPTION 'events must not be empty' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_array_length(append_events.events) > 1000 OR octet_length(append_events.events::text) > 4194304 THEN
        RAISE EXCEPTION 'events is too large: at most 1000 events and 4 MiB per call'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT x.ord, x.ev INTO bad
    FROM jsonb_array_elements(append_events.events) WITH ORDINALITY AS x (ev, ord)
    WHERE jsonb_typeof(x.ev) <> 'object'
       OR jsonb_typeof(x.ev -> 'type') IS DISTINCT FROM 'string'
       OR x.ev ->> 'type' = ''
       OR x.ev ->> 'type' = 'complete'
       OR x.ev ->> 'type' LIKE 'run\_%'
       OR x.ev ->> 'type' ~ '[\u0001-\u001f\u007f-\u009f]'
    ORDER BY x.ord
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'events[%] must be an object with a non-empty string "type" that is not reserved '
            '("complete" and "run_*" are written by runrow itself) and has no control character', bad.ord - 1
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The fence (fenced out: nothing written, NULL returned).
    IF NOT runrow._hold_claim(append_events.run_id, append_events.claim_token) THEN
        RETURN NULL;
    END IF;

    last_seq := runrow._journal(append_events.run_id, append_events.events);
    PERFORM runrow._wake_tails(append_events.run_id, last_seq);
    RETURN last_seq;
END
$fn$;

COMMENT ON FUNCTION runrow.append_events(uuid, uuid, jsonb) IS
'Append a JSON array of event objects (each with a non-empty string "type" without control '
'characters; "complete" and run_* are reserved) to the run''s journal at the next seqs, all or nothing, and NOTIFY the run''s '
'events_channel once with the last seq if a tail watches the run (watch_runs). Fenced: only while claim_token matches and the run '
'is running, checked under the run row''s lock; otherwise nothing is written and NULL is '
'returned. At most 1000 events and 4 MiB per call. Returns the last seq written.';

REVOKE ALL ON FUNCTION runrow.append_events(uuid, uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.append_events(uuid, uuid, jsonb) TO runrow_worker;
