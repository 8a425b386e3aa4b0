CREATE OR REPLACE FUNCTION runrow.acquire_model_call(run_id uuid, claim_token uuid, input_tokens_estimate integer)
RETURNS TABLE (granted boolean, wait_seconds numeric, reason text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, runrow, pg_temp
AS $fn$
DECLARE
    r runrow.agent_run;
    l runrow.rate_limit;
    why text;
    need_input numeric;
    rpm numeric;
    wait numeric := 0;
    reserved jsonb;
    -- The key's probe granted to a refused run past probe_elsewhere's bound (migration 0110).
    forced boolean := false;
BEGIN
    -- The helpers only raise: called only when a test here fails, not as a statement each
    -- before every model request (see enqueue_run).
    IF acquire_model_call.run_id IS NULL OR acquire_model_call.claim_token IS NULL
       OR acquire_model_call.input_tokens_estimate IS NULL
       OR acquire_model_call.input_tokens_estimate NOT BETWEEN 0 AND 100000000 THEN
        PERFORM runrow._require_not_null(acquire_model_call.run_id, 'run_id');
        PERFORM runrow._require_not_null(acquire_model_call.claim_token, 'claim_token');
        PERFORM runrow._require_range(
            acquire_model_call.input_tokens_estimate, 'input_tokens_estimate', 0, 100000000
        );
    END IF;

    IF NOT runrow._hold_claim(acquire_model_call.run_id, acquire_model_call.claim_token) THEN
        RETURN;  -- fenced out: no row, nothing granted, nothing written
    END IF;
    SELECT a.* INTO STRICT r FROM runrow.agent_run AS a WHERE a.id = acquire_model_call.run_id;

    why := runrow._budget_verdict(r);
    IF why IS NOT NULL THEN
        PERFORM runrow._end_for_budget(r.id, why);
        RETURN QUERY SELECT false, NULL::numeric, 'budget_exhausted'::text;
        RETURN;
    END IF;

    -- What the call is charged if its holder dies before settling it (reap_expired_runs): the
    -- API bills a response cut by a kill, and nothing else would pay for it. The worst case
    -- the database can know: the worker's estimate as input, the run's max_tokens as output
    -- (metadata.max_tokens, else the agent loop's default of 4096).
    -- Each at most what one response can be billed: 1,000,000 input tokens (the largest context
    -- window) and 128,000 output tokens (the largest max_tokens any model takes). A larger
    -- max_tokens is a request the API refuses unbilled, yet reserved as asked one kill in that
    -- window charged 10^15 tokens and put the tenant over its budget (the review of 0080).
    reserved := jsonb_build_object(
        'input_tokens', least(acquire_model_call.input_tokens_estimate, 1000000),
        'output_tokens', least(coalesce(nullif(runrow._usage_tokens(r.metadata, 'max_tokens'), 0), 4096), 128000));

    l := runrow._lock_bucket(r.rate_limit_key);
    IF l.blocked_until > now() THEN
        -- The end told is kept on the run: if the block is lifted before the worker defers the
        -- run for this wait, defer_run sees it and makes the run due (migration 0084). A write
        -- on this refusal only: the claim holds queued runs to a block's end, so the runs told
        -- are the few that held a claim when the block began.
        UPDATE runrow.agent_run AS a SET block_told_until = l.blocked_until, updated_at = now() WHERE a.id = r.id;
        RETURN QUERY SELECT false, round(extract(EPOCH FROM l.blocked_until - now()), 3), 'blocked'::text;
        RETURN;
    END IF;

    -- The key's block after a key error is over: the grant would be the key's one probe. A run
    -- refused with a 403 since the key's last answer (a 403 may be about its own request: a
    -- beta, a tool type) leaves the probe to another run of the key that could answer it
    -- (migration 0101): the claim order made such a run the probe every time, each refusal
    -- doubling the block, and the key's other runs waited with it for ever, none ever answered to
    -- tell. Which runs could answer is report_key_error's question too (its lone-run rule fails
    -- a run with none): one helper asks it for both (_key_has_other_answerer, migration 0107).
    -- Alone, it is the probe. 15 s, as for budget_reserved: longer than a worker waits in place,
    -- so the run is deferred and frees its slot (a concurrency limit of one held the waiting run
    -- out). Bounded (migration 0107): the other run may be one the claim never hands out (its
    -- concurrency_key full with another key's running run, or paused), and nobody probed the
    -- key, one claim and run_requeued every 15 s, for as long as that lasted. Once the run has
    -- been refused as long as the lone-run rule's bound (greatest(max_block_seconds, 600) s from
    -- its own first refusal, key_error_first_refused_at, migration 0110: report_key_error keeps
    -- the max_block_seconds it was given, key_error_max_block) and the key's last block or hold
    -- ended over 15 s ago with no probe since, no other run took the probe it was left: this run
    -- is, and the key says so (key_probe_forced: the lone-run rule then counts only running runs,
    -- else the queued run it was left to kept it from failing for ever, migration 0110). Not at
    -- the block's end itself: a run the claim favours was then the probe every block again, the
    -- other run claimable but never first (0101's defect). Read only while the key has a key
    -- error: a key that works takes no statement more.
    IF l.key_errors > 0 AND r.key_error_refused IS NOT NULL AND r.key_error_answers = l.key_answers THEN
        forced := r.key_error_first_refused_at
                <= now() - make_interval(secs => greatest(l.key_error_max_block, 600)::float8)
            AND l.key_error_until <= now() - interval '15 seconds';
        IF NOT forced AND runrow._key_has_other_answerer(l, r.id, r.conversation_id, false, false) THEN
            IF r.block_told_until IS NOT NULL THEN
                -- Not a block this run waits for: a lift must not make its deferral due at once.
                UPDATE runrow.agent_run AS a SET block_told_until = NULL, updated_at = now() WHERE a.id = r.id;
            END IF;
            RETURN QUERY SELECT false, 15::numeric, 'probe_elsewhere'::text;
            RETURN;
        END IF;
    END IF;

    IF l.rate_limit_key IS NOT NULL THEN
        -- An estimate over a minute's worth waits for a full bucket instead of forever, and
        -- takes that minute's worth: the rest is charged when the call's usage settles
        -- (append_step). A grant that never settles (the request failed, the worker died) so
        -- holds the key back a minute at most; the whole estimate put it in debt (100,000,000
        -- tokens at 30,000 a minute: every run of the key waited 55 hours, issue 11's SQL audit).
        need_input := least(acquire_model_call.input_tokens_estimate, l.input_tokens_per_minute);
        -- A key without a requests limit of its own is paced after a header block until the
        -- API's bucket is full again (report_rate_limit_exhausted, _lock_bucket): its waiting
        -- requests go one at a time, not at once.
        rpm := coalesce(l.requests_per_minute, l.paced_requests_per_minute);
        IF rpm IS NOT NULL AND l.requests_left < 1 THEN
            wait := greatest(wait, (1 - l.requests_left) * 60 / rpm);
        END IF;
        IF l.input_tokens_per_minute IS NOT NULL AND l.input_tokens_left < need_input THEN
            wait := greatest(wait, (need_input - l.input_tokens_left) * 60 / l.input_tokens_per_minute);
        END IF;
        -- Output is charged when the step settles; a bucket in debt waits until it is back above 0.
        IF l.output_tokens_per_minute IS NOT NULL AND l.output_tokens_left <= 0 THEN
            wait := greatest(wait, (1 - l.output_tokens_left) * 60 / l.output_tokens_per_minute);
        END IF;
        -- A block's end put the refill in the future (_block_key): nothing refills before it, so
        -- the bucket counts from then, and a waiter does not poll every 0.1 s meanwhile.
        IF wait > 0 AND l.refilled_at > now() THEN
            wait := wait + extract(EPOCH FROM l.refilled_at - now());
        END IF;
    END IF;
    IF wait = 0 THEN
        -- The tenant's budget with its calls in flight (migration 0088), under its budget row's
        -- lock, taken after the bucket's as every settle takes them.
        why := runrow._tenant_reserve(r, reserved);
        IF why IS NOT NULL AND why <> 'budget_reserved' THEN
            -- Spent, settled, since the verdict above: a call settled in between.
            PERFORM runrow._end_for_budget(r.id, why);
            RETURN QUERY SELECT false, NULL::numeric, 'budget_exhausted'::text;
            RETURN;
        END IF;
    END IF;
    IF wait > 0 OR why IS NOT NULL THEN
        IF r.block_told_until IS NOT NULL THEN
            -- A block told before (this claim or the last holder's, released or reaped) is not
            -- what this wait is for: left, a block lifted since made this rate_limited deferral
            -- due at once (defer_run), a wasted claim (the review).
            UPDATE runrow.agent_run AS a SET block_told_until = NULL, updated_at = now() WHERE a.id = r.id;
        END IF;
        IF why IS NOT NULL THEN
            -- The tenant's calls in flight may settle lower than reserved. Longer than a worker
            -- waits in place (rate_limit_max_wait, 10 s): it defers the run and frees its slot, not
            -- polling the budget row every second from a slot a tenant near its budget would fill.
            RETURN QUERY SELECT false, 15::numeric, why;
            RETURN;
        END IF;
        RETURN QUERY SELECT false, round(greatest(wait, 0.001), 3), 'rate_limited'::text;
        RETURN;
    END IF;

    IF l.rate_limit_key IS NULL THEN
        -- No limit and no block for this key. A granted row as OUT values and RETURN NEXT: no
        -- statement for a row of values (issue 11).
        UPDATE runrow.agent_run AS a
        SET model_call_reserved = reserved, model_call_attempt = r.attempt, block_told_until = NULL,
            updated_at = now()
        WHERE a.id = r.id;
        granted := true;
        wait_seconds := 0;
        RETURN NEXT;
        RETURN;
    END IF;

    UPDATE runrow.rate_limit AS b
    SET requests_left = CASE WHEN rpm IS NULL THEN 0 ELSE b.requests_left - 1 END,
        paced_full_since = NULL,  -- drawn on: a pace's bucket is not standing full (_lock_bucket)
        input_tokens_left = CASE WHEN b.input_tokens_per_minute IS NULL THEN 0
            ELSE b.input_tokens_left - need_input END,
        -- The key's last word was an API key or account error (report_key_error) and its block
        -- is over: this request is the one probe. The other runs of the key are held for one
        -- more block, until the probe is answered (its usage settled ends the streak and the
        -- hold; another key error makes the next block longer), so a fleet does not send one
        -- request per slot into a key that is still broken every time a block ends.
        blocked_until = CASE WHEN b.key_errors > 0
            THEN now() + make_interval(secs => b.key_error_block::double precision) ELSE b.blocked_until END,
        blocked_by_run = CASE WHEN b.key_errors > 0 THEN r.id ELSE b.blocked_by_run END,
        key_error_until = CASE WHEN b.key_errors > 0
            THEN now() + make_interval(secs => b.key_error_block::double precision) ELSE b.key_error_until END,
        key_probe_by = CASE WHEN b.key_errors > 0 THEN r.id ELSE b.key_probe_by END,
        key_probe_forced = CASE WHEN b.key_errors > 0 THEN forced ELSE b.key_probe_forced END,
        updated_at = now()
    WHERE b.rate_limit_key = l.rate_limit_key;
    UPDATE runrow.agent_run AS a
    SET granted_input_tokens = CASE WHEN l.input_tokens_per_minute IS NULL THEN NULL ELSE need_input END,
        model_call_reserved = reserved,
        model_call_attempt = r.attempt,
        block_told_until = NULL,
        updated_at = now()
    WHERE a.id = r.id;
    granted := true;
    wait_seconds := 0;
    RETURN NEXT;
END
$fn$;

COMMENT ON FUNCTION runrow.acquire_model_call(uuid, uuid, integer) IS
'Asked by the worker before every model request of a run it holds. Budgets first: when the '
'run''s token_budget or cost_budget (at model_price) or its tenant''s rolling-day budget '
'(set_tenant_budget) is spent, the run ends here: failed, error budget_exhausted: ..., result '
'{text of its latest model turn, stop_reason budget_exhausted}, journaled budget_exhausted and '
'complete; the row says (false, NULL, budget_exhausted). Then the run''s rate_limit_key, under '
'its bucket row''s lock: blocked (report_rate_limited) gives (false, seconds left, blocked) '
'and keeps the block''s end on the run (block_told_until, read by defer_run; a grant clears it); '
'too few requests or uncached input tokens left for input_tokens_estimate, or output tokens in '
'debt, gives (false, seconds until there are, rate_limited) (a key with no requests limit of its '
'own is paced so after a header block: report_rate_limit_exhausted). Then the tenant''s budget with '
'its calls in flight, under its budget row''s lock: when the settled spend plus the reservations '
'of the tenant''s other granted, unsettled calls plus this call''s would pass tokens_per_day or '
'cost_per_day, the call waits while another is in flight: (false, 15, budget_reserved), nothing '
'taken (the calls in flight may settle lower; alone, a call goes), so the tenant passes its '
'budget by one call''s reservation at most; the first call told so is the tenant''s waiter '
'(tenant_budget.waiter_run), and while it waits another call goes only if it fits beside the '
'waiter''s reservation too; the settled spend alone at the budget ends the run '
'as above. Else one request and the estimate '
'(at most a minute''s worth of input; the rest is charged when the usage settles) are taken and '
'(true, 0, NULL) returned. While the key has an API key or account error (report_key_error), '
'the grant after its block is the one probe: the key is held for the other runs for one more '
'block, until the probe is answered. A run refused with a 403 since the key''s last answer '
'(report_key_error with own_request_possible; the 403 may be its own request''s) is not made '
'the probe while another run of the key could answer (_key_has_other_answerer, report_key_error''s '
'lone-run rule asks the same: in another conversation, running, or queued, not behind a turn of '
'its own conversation and due within 15 s, not refused a 403 since that answer itself): '
'(false, 15, probe_elsewhere), longer than a worker waits in place, so it defers the run; '
'alone, it is the probe, and so it is whatever else waits once the run has been refused '
'greatest(key_error_max_block, 600) s (from its first refusal in the key''s streak, '
'agent_run.key_error_first_refused_at; key_error_max_block: the max_block_seconds '
'report_key_error was last given) and the key''s last block ended over 15 s ago with no probe '
'since (the run left the probe to may be one the claim never hands out): the key''s '
'key_probe_forced says so, and report_key_error''s lone-run rule then counts only running runs '
'as able to answer. A key without a row is not '
'limited. Every grant '
'reserves the call''s worst case on the run (model_call_reserved: input_tokens_estimate as '
'input tokens, at most 1000000, metadata.max_tokens, else 4096, as output tokens, at most 128000), '
'counted in a budgeted tenant''s reserved total (tenant_reservation): append_step or record_usage '
'settles the grant with the real usage and clears it; if the holder dies first, '
'reap_expired_runs charges the reservation to the run''s spend, its tenant''s hour and the '
'budgets. Fenced: no row and nothing written unless claim_token '
'holds the running run. Bad input (NULL, estimate outside 0..100000000) raises 22004/22023.';

REVOKE ALL ON FUNCTION runrow.acquire_model_call(uuid, uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runrow.acquire_model_call(uuid, uuid, integer) TO runrow_worker;
