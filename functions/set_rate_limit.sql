-- set_rate_limit's body, and update_rate_limit's write (migration 0098). keep_pace: the
-- caller kept the key's requests limit as it was (update_rate_limit without one), so a pace
-- a header block set (report_rate_limit_exhausted) stands, with the level it mirrors: `runrow
-- limits set KEY --input-tpm N` wiped a pace the operator did not mention.
CREATE OR REPLACE FUNCTION runrow._set_rate_limit(
    rate_limit_key text, requests_per_minute integer, input_tokens_per_minute integer, output_tokens_per_minute integer,
    keep_pace boolean
)
RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    block_ended timestamptz;
BEGIN
    PERFORM runrow._require_rate_limit(
        _set_rate_limit.rate_limit_key, _set_rate_limit.requests_per_minute,
        _set_rate_limit.input_tokens_per_minute, _set_rate_limit.output_tokens_per_minute
    );

    IF _set_rate_limit.requests_per_minute IS NULL AND _set_rate_limit.input_tokens_per_minute IS NULL
       AND _set_rate_limit.output_tokens_per_minute IS NULL THEN
        DELETE FROM runrow.rate_limit AS l WHERE l.rate_limit_key = _set_rate_limit.rate_limit_key
        RETURNING l.blocked_until INTO block_ended;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'rate_limit_key "%" has no rate limit to remove', _set_rate_limit.rate_limit_key
                USING ERRCODE = 'no_data_found';
        END IF;
        -- The block goes with the row, and so does its hold on queued runs: a claim that met the
        -- block set their not_before to its end (up to 24 h away), so they stayed queued after it
        -- was removed (the fleet-limits audit). Only a not_before equal to the block's end is
        -- the block's; a retry_in backoff keeps its own. Due now, and the dispatchers are woken.
        IF block_ended > now() THEN
            PERFORM runrow._lift_held_runs(_set_rate_limit.rate_limit_key, block_ended);
        END IF;
        RETURN;
    END IF;
    -- Only a key being set: one stored before migration 0085 can still be removed (above).
    PERFORM runrow._require_printable(_set_rate_limit.rate_limit_key, 'rate_limit_key');

    -- A new key starts with full buckets; a changed one keeps what it holds (brought up to
    -- now, at most the new minute's worth), and a newly limited dimension starts full.
    INSERT INTO runrow.rate_limit AS l (
        rate_limit_key, requests_per_minute, input_tokens_per_minute, output_tokens_per_minute,
        requests_left, input_tokens_left, output_tokens_left
    )
    VALUES (
        _set_rate_limit.rate_limit_key, _set_rate_limit.requests_per_minute, _set_rate_limit.input_tokens_per_minute,
        _set_rate_limit.output_tokens_per_minute, coalesce(_set_rate_limit.requests_per_minute, 0),
        coalesce(_set_rate_limit.input_tokens_per_minute, 0), coalesce(_set_rate_limit.output_tokens_per_minute, 0)
    )
    ON CONFLICT ON CONSTRAINT rate_limit_pkey DO NOTHING;
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM runrow._lock_bucket(_set_rate_limit.rate_limit_key);
    UPDATE runrow.rate_limit AS l
    SET requests_per_minute = _set_rate_limit.requests_per_minute,
        input_tokens_per_minute = _set_rate_limit.input_tokens_per_minute,
        output_tokens_per_minute = _set_rate_limit.output_tokens_per_minute,
        -- A newly limited request bucket starts full, unless a block holds it empty until the
        -- block's end (report_rate_limited's rule for a limited key): a key that had no limits when a
        -- 429 blocked it started full, and burst into the wall again at the block's end.
        -- A paced key's bucket (report_rate_limit_exhausted) mirrors the API's, so it keeps what
        -- it holds too.
        requests_left = CASE WHEN _set_rate_limit.requests_per_minute IS NULL THEN
            CASE WHEN _set_rate_limit.keep_pace AND l.paced_requests_per_minute IS NOT NULL THEN l.requests_left ELSE 0 END
        ELSE least(
            CASE WHEN l.requests_per_minute IS NOT NULL OR l.paced_requests_per_minute IS NOT NULL THEN l.requests_left
                WHEN l.blocked_until > now() THEN 0
                ELSE _set_rate_limit.requests_per_minute END,
            _set_rate_limit.requests_per_minute) END,
        -- The operator's word on the key replaces the pace a header block set: a requests limit
        -- set is the key's pace from now on, and one removed (or never set) leaves it unpaced,
        -- not held to a pace learned before (it was only shadowed under a limit, and came back
        -- when the limit was removed). A word on the tokens only (keep_pace) is none on it.
        paced_requests_per_minute = CASE WHEN _set_rate_limit.keep_pace THEN l.paced_requests_per_minute END,
        paced_requests_limit = CASE WHEN _set_rate_limit.keep_pace THEN l.paced_requests_limit END,
        paced_full_since = CASE WHEN _set_rate_limit.keep_pace THEN l.paced_full_since END,
        input_tokens_left = CASE WHEN _set_rate_limit.input_tokens_per_minute IS NULL THEN 0 ELSE least(
            CASE WHEN l.input_tokens_per_minute IS NULL THEN _set_rate_limit.input_tokens_per_minute
                ELSE l.input_tokens_left END,
            _set_rate_limit.input_tokens_per_minute) END,
        output_tokens_left = CASE WHEN _set_rate_limit.output_tokens_per_minute IS NULL THEN 0 ELSE least(
            CASE WHEN l.output_tokens_per_minute IS NULL THEN _set_rate_limit.output_tokens_per_minute
                ELSE l.output_tokens_left END,
            _set_rate_limit.output_tokens_per_minute) END,
        updated_at = now()
    WHERE l.rate_limit_key = _set_rate_limit.rate_limit_key;
END
$fn$;

COMMENT ON FUNCTION runrow._set_rate_limit(text, integer, integer, integer, boolean) IS
'Private. set_rate_limit''s write (see it), called by set_rate_limit with keep_pace false and by '
'update_rate_limit with keep_pace true when it keeps the key''s requests limit: then a pace a '
'header block set (paced_requests_per_minute, paced_requests_limit, paced_full_since) and the '
'requests level it mirrors stand, where set_rate_limit ends the pace.';

REVOKE ALL ON FUNCTION runrow._set_rate_limit(text, integer, integer, integer, boolean) FROM PUBLIC;

CREATE OR REPLACE FUNCTION runrow.set_rate_limit(
    rate_limit_key text, requests_per_minute integer, input_tokens_per_minute integer, output_tokens_per_minute integer
)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    PERFORM runrow._set_rate_limit(
        set_rate_limit.rate_limit_key, set_rate_limit.requests_per_minute,
        set_rate_limit.input_tokens_per_minute, set_rate_limit.output_tokens_per_minute, false
    );
END
$fn$;

COMMENT ON FUNCTION runrow.set_rate_limit(text, integer, integer, integer) IS
'The operator sets the fleet-wide limits of a rate_limit_key (a model name, the default key of '
'its runs, or a key runs name at enqueue): requests, uncached input tokens and output tokens '
'per minute, each NULL (not limited) or more than 0, as token buckets that refill with the '
'database clock and hold at most a minute''s worth. A new key starts full; a changed key keeps '
'its levels (capped to the new limits) and its block, and ends a pace a header block set '
'(report_rate_limit_exhausted: the limits set replace it). All three NULL removes the key''s row '
'(limits and any block: queued runs of the key held back by the block are due at once, and the '
'dispatchers are woken); P0002 when it has none. Bad input (NULL or over-long key, a rate not '
'more than 0) raises 22004/22023 naming the argument and writes nothing.';

REVOKE ALL ON FUNCTION runrow.set_rate_limit(text, integer, integer, integer) FROM PUBLIC;
