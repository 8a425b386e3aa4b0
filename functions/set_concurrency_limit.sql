CREATE OR REPLACE FUNCTION runrow.set_concurrency_limit(concurrency_key text, max_running integer)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
BEGIN
    PERFORM runrow._require_not_null(set_concurrency_limit.concurrency_key, 'concurrency_key');
    PERFORM runrow._require_key(set_concurrency_limit.concurrency_key, 'concurrency_key');
    IF set_concurrency_limit.max_running IS NULL THEN
        DELETE FROM runrow.concurrency_limit AS l
        WHERE l.concurrency_key = set_concurrency_limit.concurrency_key;
        -- As set_rate_limit, set_tenant_budget and set_model_price: removing what is not there
        -- is a mistyped key, said so, not a silent success.
        IF NOT FOUND THEN
            RAISE EXCEPTION 'concurrency_key "%" has no concurrency limit to remove', set_concurrency_limit.concurrency_key
                USING ERRCODE = 'no_data_found';
        END IF;
        RETURN;
    END IF;
    -- Only a key being set: one stored before migration 0085 can still be removed (above).
    PERFORM runrow._require_printable(set_concurrency_limit.concurrency_key, 'concurrency_key');
    PERFORM runrow._require_range(set_concurrency_limit.max_running, 'max_running', 0, 100000);
    INSERT INTO runrow.concurrency_limit AS l (concurrency_key, max_running)
    VALUES (set_concurrency_limit.concurrency_key, set_concurrency_limit.max_running)
    ON CONFLICT ON CONSTRAINT concurrency_limit_pkey DO UPDATE
    SET max_running = excluded.max_running, updated_at = now();
END
$fn$;

COMMENT ON FUNCTION runrow.set_concurrency_limit(text, integer) IS
'Cap concurrency_key (1..200 characters) at max_running (0..100000; 0 pauses the key) runs '
'running or waiting at once; NULL max_running removes the cap (P0002 when there is none). From the next claim on, a queued '
'run of the key is not claimed while the key is at its limit (the agent_run_concurrency_limit '
'trigger guarantees it under concurrent claimers); runs already running are never stopped, so '
'lowering a limit below the running count only holds new claims until enough of them end. '
'Bad input raises 22004/22023 naming the argument and writes nothing.';

REVOKE ALL ON FUNCTION runrow.set_concurrency_limit(text, integer) FROM PUBLIC;
