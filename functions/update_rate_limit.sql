CREATE OR REPLACE FUNCTION runrow.update_rate_limit(
    rate_limit_key text,
    requests_per_minute integer DEFAULT NULL,
    input_tokens_per_minute integer DEFAULT NULL,
    output_tokens_per_minute integer DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    l runrow.rate_limit;
BEGIN
    PERFORM runrow._require_rate_limit(
        update_rate_limit.rate_limit_key, update_rate_limit.requests_per_minute,
        update_rate_limit.input_tokens_per_minute, update_rate_limit.output_tokens_per_minute
    );
    IF update_rate_limit.requests_per_minute IS NULL AND update_rate_limit.input_tokens_per_minute IS NULL
       AND update_rate_limit.output_tokens_per_minute IS NULL THEN
        RAISE EXCEPTION 'requests_per_minute, input_tokens_per_minute or output_tokens_per_minute must be '
            'given: NULL keeps that limit as it is (set_rate_limit(rate_limit_key, NULL, NULL, NULL) removes '
            'the key''s limits)'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM runrow._require_printable(update_rate_limit.rate_limit_key, 'rate_limit_key');
    -- The key's row is locked before its limits are read, and set_rate_limit writes them under
    -- the same lock: a concurrent change of another limit waits, then stands (the CLI read the
    -- key's limits, then set all three: a change committed between the two was overwritten).
    -- A new key gets a row with no limits first, so two first updates of it take turns too; a
    -- row removed meanwhile (set_rate_limit with three NULLs) is made again.
    LOOP
        INSERT INTO runrow.rate_limit AS r (rate_limit_key) VALUES (update_rate_limit.rate_limit_key)
        ON CONFLICT ON CONSTRAINT rate_limit_pkey DO NOTHING;
        SELECT r.* INTO l FROM runrow.rate_limit AS r WHERE r.rate_limit_key = update_rate_limit.rate_limit_key
        FOR UPDATE;
        EXIT WHEN FOUND;
    END LOOP;
    -- set_rate_limit's rules for the levels: a newly limited dimension starts full (a key's row
    -- made just now has none), a changed one keeps its level, capped. A pace a header block
    -- set stands unless a requests limit is given (set_rate_limit ended it on every call).
    PERFORM runrow._set_rate_limit(
        update_rate_limit.rate_limit_key,
        coalesce(update_rate_limit.requests_per_minute, l.requests_per_minute),
        coalesce(update_rate_limit.input_tokens_per_minute, l.input_tokens_per_minute),
        coalesce(update_rate_limit.output_tokens_per_minute, l.output_tokens_per_minute),
        keep_pace => update_rate_limit.requests_per_minute IS NULL
    );
END
$fn$;

COMMENT ON FUNCTION runrow.update_rate_limit(text, integer, integer, integer) IS
'The operator changes some of a rate_limit_key''s limits (see set_rate_limit): each of '
'requests_per_minute, input_tokens_per_minute and output_tokens_per_minute given (more than 0) '
'replaces that limit, and one left NULL keeps the key''s current value (none for a new key: not '
'limited), under the key''s row lock from the read to the write, so two concurrent updates of '
'different limits both stand. Levels as set_rate_limit: a new or newly limited bucket starts '
'full, a changed one keeps its level (capped) and the key its block. A pace a header block set '
'(report_rate_limit_exhausted) ends when requests_per_minute is given, and stands with its '
'level when it is NULL. To lift a limit, '
'set_rate_limit the whole; all three NULL raises 22004. Bad input (NULL, over-long or '
'unprintable key, a limit not more than 0) raises 22004/22023 naming the argument and writes '
'nothing.';

REVOKE ALL ON FUNCTION runrow.update_rate_limit(text, integer, integer, integer) FROM PUBLIC;
