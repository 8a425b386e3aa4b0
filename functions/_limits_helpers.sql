-- Private helpers of the fleet limits (rate limits, budgets). Not granted to any role: only
-- the SECURITY DEFINER functions (running as the owner) call them.
-- No SET clauses, as in functions/_helpers.sql: they run under their callers' search_path.

-- An optional limit: NULL (none) or more than 0, and finite. Zero would read as a limit and
-- block forever; NaN (which sorts above every number, so NaN > 0) and Infinity limit nothing,
-- and a NaN summed into a spend poisons it (migration 0065).
CREATE OR REPLACE FUNCTION runrow._require_positive(value numeric, arg text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $fn$
BEGIN
    IF value <= 0 OR value >= 'Infinity' THEN
        RAISE EXCEPTION '% must be NULL or a finite number more than 0, got %', arg, value
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

-- A tenant budget's arguments, as set_tenant_budget and update_tenant_budget take them: a key
-- (its printable rule is the callers': a key stored before it can still be removed), and two
-- optional budgets.
CREATE OR REPLACE FUNCTION runrow._require_tenant_budget(fairness_key text, tokens_per_day bigint, cost_per_day numeric)
RETURNS void
LANGUAGE plpgsql
AS $fn$
BEGIN
    PERFORM runrow._require_not_null(_require_tenant_budget.fairness_key, 'fairness_key');
    PERFORM runrow._require_key(_require_tenant_budget.fairness_key, 'fairness_key');
    PERFORM runrow._require_positive(_require_tenant_budget.tokens_per_day, 'tokens_per_day');
    PERFORM runrow._require_positive(_require_tenant_budget.cost_per_day, 'cost_per_day');
END
$fn$;

-- A key's rate limits, as set_rate_limit and update_rate_limit take them: a key (its printable
-- rule is the callers': a key stored before it can still be removed), and three optional limits.
CREATE OR REPLACE FUNCTION runrow._require_rate_limit(
    rate_limit_key text, requests_per_minute integer, input_tokens_per_minute integer, output_tokens_per_minute integer
)
RETURNS void
LANGUAGE plpgsql
AS $fn$
BEGIN
    PERFORM runrow._require_not_null(_require_rate_limit.rate_limit_key, 'rate_limit_key');
    PERFORM runrow._require_key(_require_rate_limit.rate_limit_key, 'rate_limit_key');
    PERFORM runrow._require_positive(_require_rate_limit.requests_per_minute, 'requests_per_minute');
    PERFORM runrow._require_positive(_require_rate_limit.input_tokens_per_minute, 'input_tokens_per_minute');
    PERFORM runrow._require_positive(_require_rate_limit.output_tokens_per_minute, 'output_tokens_per_minute');
END
$fn$;

-- A wait a worker reports, in seconds: more than 0 and at most `most` (NaN sorts above every
-- number, so it is over `most` too).
CREATE OR REPLACE FUNCTION runrow._require_seconds(value numeric, arg text, most numeric)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $fn$
BEGIN
    IF value <= 0 OR value > most THEN
        RAISE EXCEPTION '% must be more than 0 and at most %, got %', arg, most, value
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

-- Lock a key's bucket row and bring its buckets up to now: each refills at its per-minute
-- rate, up to a minute's worth. NULL when the key has no row (no limit, no block). The lock is
-- held to the end of the caller's transaction: that is what keeps concurrent grants from
-- overdrawing. A transaction that started before the last refill refills nothing (greatest).
-- A key without a requests limit of its own refills its requests bucket at the pace a header
-- block set (report_rate_limit_exhausted), up to the API's bucket size; full for one more
-- request's time, the pace is over. The moment it was full is kept (paced_full_since; a grant
-- clears it): judged from one lock to the next, the pace never ended while settles and waiting
-- polls locked the bucket more often than a request refills (the review of session 59).
CREATE OR REPLACE FUNCTION runrow._lock_bucket(rate_limit_key text)
RETURNS runrow.rate_limit
LANGUAGE plpgsql
AS $fn$
DECLARE
    l runrow.rate_limit;
    secs numeric;
    rpm numeric;
    cap numeric;
    requests numeric;
    pace_over boolean := false;
    full_at timestamptz;
BEGIN
    SELECT r.* INTO l FROM runrow.rate_limit AS r WHERE r.rate_limit_key = _lock_bucket.rate_limit_key FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    secs := greatest(0, extract(EPOCH FROM now() - l.refilled_at));
    IF secs = 0 THEN
        RETURN l;
    END IF;
    rpm := coalesce(l.requests_per_minute, l.paced_requests_per_minute);
    cap := coalesce(l.requests_per_minute, l.paced_requests_limit);
    requests := coalesce(least(cap, round(l.requests_left + rpm * secs / 60, 6)), 0);
    -- The paced bucket stood full for a request's time with nobody drawing on it: the API's is
    -- full again too, and the key's demand is under its pace. (Full alone is no end: with a
    -- limit of 1 the bucket is full as the block ends.)
    IF l.requests_per_minute IS NULL AND l.requests_left + rpm * secs / 60 >= l.paced_requests_limit THEN
        full_at := coalesce(l.paced_full_since,
            l.refilled_at + make_interval(secs => (greatest(0, l.paced_requests_limit - l.requests_left) * 60 / rpm)::double precision));
        pace_over := extract(EPOCH FROM now() - full_at) >= 60 / rpm;
    END IF;
    UPDATE runrow.rate_limit AS r
    SET requests_left = CASE WHEN pace_over THEN 0 ELSE requests END,
        paced_requests_per_minute = CASE WHEN pace_over THEN NULL ELSE r.paced_requests_per_minute END,
        paced_requests_limit = CASE WHEN pace_over THEN NULL ELSE r.paced_requests_limit END,
        paced_full_since = CASE WHEN pace_over THEN NULL ELSE full_at END,
        input_tokens_left = coalesce(
            least(r.input_tokens_per_minute, round(r.input_tokens_left + r.input_tokens_per_minute * secs / 60, 6)), 0),
        output_tokens_left = coalesce(
            least(r.output_tokens_per_minute, round(r.output_tokens_left + r.output_tokens_per_minute * secs / 60, 6)), 0),
        refilled_at = now()
    WHERE r.rate_limit_key = _lock_bucket.rate_limit_key
    RETURNING r.* INTO l;
    RETURN l;
END
$fn$;

-- A usage count as the API reports it: a non-negative integer, else 0 (usage is the
-- provider's object, stored verbatim; a field it lacks or mistypes costs nothing here).
CREATE OR REPLACE FUNCTION runrow._usage_tokens(usage jsonb, field text)
RETURNS bigint
LANGUAGE sql
IMMUTABLE
AS $fn$
    SELECT CASE
        WHEN jsonb_typeof(_usage_tokens.usage -> _usage_tokens.field) = 'number'
            THEN greatest(0, least(floor((_usage_tokens.usage ->> _usage_tokens.field)::numeric), 1e15))::bigint
        ELSE 0
    END;
$fn$;

-- Why the run may make no further model request, or NULL. Budgets are checked against what
-- was spent (a step may cross a budget; the one after it is not sent).
CREATE OR REPLACE FUNCTION runrow._budget_verdict(r runrow.agent_run)
RETURNS text
LANGUAGE plpgsql
AS $fn$
BEGIN
    IF r.budget_exhausted IS NOT NULL THEN
        RETURN r.budget_exhausted;
    END IF;
    IF r.token_budget IS NOT NULL AND r.spent_tokens >= r.token_budget THEN
        RETURN format('budget_exhausted: the run used %s tokens of its token_budget of %s', r.spent_tokens, r.token_budget);
    END IF;
    IF r.cost_budget IS NOT NULL THEN
        IF NOT EXISTS (SELECT 1 FROM runrow.model_price AS p WHERE p.model = r.model) THEN
            RETURN format('budget_exhausted: the run has a cost_budget but model "%s" has no price (set_model_price)',
                r.model);
        END IF;
        IF r.spent_cost >= r.cost_budget THEN
            RETURN format('budget_exhausted: the run cost %s USD of its cost_budget of %s USD',
                round(r.spent_cost, 6), r.cost_budget);
        END IF;
    END IF;
    RETURN runrow._tenant_verdict(r.fairness_key);
END
$fn$;

-- Why a tenant may make no further model request (its rolling day, the hours that overlap
-- the last 24 hours, reached its budget), or NULL.
CREATE OR REPLACE FUNCTION runrow._tenant_verdict(fairness_key text)
RETURNS text
LANGUAGE plpgsql
AS $fn$
DECLARE
    b runrow.tenant_budget;
    spent record;
BEGIN
    SELECT t.* INTO b FROM runrow.tenant_budget AS t WHERE t.fairness_key = _tenant_verdict.fairness_key;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    spent := runrow._tenant_spent(b.fairness_key);
    RETURN runrow._tenant_over(b, spent.tokens, spent.cost);
END
$fn$;

-- What a tenant spent (settled) in its rolling day: every hour that overlaps the last 24.
-- The hour bound is a row comparison on spend_hour's key, which spend_hour_by_hour cannot serve:
-- written `s.hour > …`, the planner read by_hour (hour's correlation is 1.0, so thousands of
-- entries in heap order looked cheaper than the key's few hundred) and filtered out every other
-- tenant's day. Every model request pays this twice (_budget_verdict, _tenant_reserve): 60
-- tenants x 10 models read 30,000 entries instead of 500 (tests/test_tenant_spent_lookup.py).
CREATE OR REPLACE FUNCTION runrow._tenant_spent(fairness_key text, OUT tokens numeric, OUT cost numeric)
LANGUAGE plpgsql
AS $fn$
BEGIN
    SELECT coalesce(sum(s.tokens), 0), coalesce(sum(s.cost), 0) INTO tokens, cost
    FROM runrow.spend_hour AS s
    WHERE s.fairness_key = _tenant_spent.fairness_key
      AND (s.fairness_key, s.hour) > (_tenant_spent.fairness_key, now() - interval '25 hours');
END
$fn$;

-- Why a tenant that spent `tokens` and `cost` in its rolling day is over budget b, or NULL.
CREATE OR REPLACE FUNCTION runrow._tenant_over(b runrow.tenant_budget, tokens numeric, cost numeric)
RETURNS text
LANGUAGE plpgsql
AS $fn$
BEGIN
    IF _tenant_over.tokens >= b.tokens_per_day THEN
        RETURN format('budget_exhausted: tenant "%s" used %s tokens of its %s per day',
            b.fairness_key, _tenant_over.tokens, b.tokens_per_day);
    END IF;
    IF _tenant_over.cost >= b.cost_per_day THEN
        RETURN format('budget_exhausted: tenant "%s" spent %s USD of its %s USD per day',
            b.fairness_key, round(_tenant_over.cost, 6), b.cost_per_day);
    END IF;
    RETURN NULL;
END
$fn$;

-- A queued run of a tenant over its budget is not started (the claim, under the run's
-- lock): failed with the budget's error, nothing silently held; budget_exhausted and
-- complete journaled, the conversation's next turn woken.
CREATE OR REPLACE FUNCTION runrow._fail_queued_for_budget(run_id uuid, why text)
RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    conv uuid;
    st text;
    reason text := coalesce(_fail_queued_for_budget.why, 'budget_exhausted: the tenant is over its daily budget');
BEGIN
    -- Found by primary key alone, its status tested here: `status = 'queued'` beside the id
    -- let the planner scan a partial index of every queued run instead (statistics of an empty
    -- queue), once per run failed (tests/test_fence_plans.py). The caller holds the row locked.
    SELECT a.status INTO st FROM runrow.agent_run AS a WHERE a.id = _fail_queued_for_budget.run_id FOR UPDATE;
    IF st IS DISTINCT FROM 'queued' THEN
        RETURN;
    END IF;
    UPDATE runrow.agent_run AS a
    SET status = 'failed', finished_at = now(), error = reason, budget_exhausted = reason, updated_at = now()
    WHERE a.id = _fail_queued_for_budget.run_id
    RETURNING a.conversation_id INTO conv;
    PERFORM runrow._journal(_fail_queued_for_budget.run_id, jsonb_build_array(jsonb_build_object(
        'type', 'budget_exhausted', 'reason', reason)));
    PERFORM runrow._journal_complete(_fail_queued_for_budget.run_id, conv, 'failed', NULL, reason);
END
$fn$;

-- End a running run for its budget: failed, the error says which budget, the result keeps
-- the text of its latest model turn, a budget_exhausted event then complete journaled. The
-- caller holds the run row's lock (the fence).
CREATE OR REPLACE FUNCTION runrow._end_for_budget(run_id uuid, why text)
RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    last_turn record;
    res jsonb;
    conv uuid;
    reserved boolean;
BEGIN
    SELECT s.payload, s.stop_reason INTO last_turn
    FROM runrow.agent_step AS s
    WHERE s.run_id = _end_for_budget.run_id AND s.kind = 'model_turn'
    ORDER BY s.seq DESC
    LIMIT 1;
    res := jsonb_build_object(
        'text', coalesce((
            SELECT string_agg(b.block ->> 'text', '' ORDER BY b.ord)
            FROM json_array_elements(runrow._json_probe(last_turn.payload)) WITH ORDINALITY AS b (block, ord)
            WHERE b.block ->> 'type' = 'text'), ''),
        'stop_reason', 'budget_exhausted');
    UPDATE runrow.agent_run AS a
    SET status = 'failed', finished_at = now(), error = _end_for_budget.why, result = res,
        claim_token = NULL, claim_expires_at = NULL, granted_input_tokens = NULL,
        budget_exhausted = _end_for_budget.why, updated_at = now()
    WHERE a.id = _end_for_budget.run_id
    RETURNING a.conversation_id, a.model_call_reserved IS NOT NULL INTO conv, reserved;
    -- A call of this claim granted and never settled (asked again after a refusal) is over.
    IF reserved THEN
        PERFORM runrow._tenant_unreserve(_end_for_budget.run_id);
    END IF;
    PERFORM runrow._journal(_end_for_budget.run_id, jsonb_build_array(jsonb_build_object(
        'type', 'budget_exhausted', 'reason', _end_for_budget.why)));
    PERFORM runrow._journal_complete(_end_for_budget.run_id, conv, 'failed', res, _end_for_budget.why);
END
$fn$;

-- Settle a model turn's usage (append_step, record_usage; under the run row's lock): what
-- _charge_usage charges, and the key's buckets (the grant's estimate is replaced by the real
-- uncached input; output is charged now). The bucket row is locked before the tenant's budget
-- row (_charge_usage), as every settle does, so two settles never wait on each other crosswise.
CREATE OR REPLACE FUNCTION runrow._settle_usage(run_id uuid, usage jsonb)
RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    r runrow.agent_run;
    inp bigint := runrow._usage_tokens(_settle_usage.usage, 'input_tokens');
    outp bigint := runrow._usage_tokens(_settle_usage.usage, 'output_tokens');
    cw bigint := runrow._usage_tokens(_settle_usage.usage, 'cache_creation_input_tokens');
    bucket runrow.rate_limit;
BEGIN
    SELECT a.* INTO r FROM runrow.agent_run AS a WHERE a.id = _settle_usage.run_id;
    -- Only uncached input counts toward the input limit (cache writes are uncached input).
    IF r.rate_limit_key IS NOT NULL THEN
        bucket := runrow._lock_bucket(r.rate_limit_key);
    END IF;
    IF bucket.rate_limit_key IS NOT NULL THEN
        UPDATE runrow.rate_limit AS l
        SET input_tokens_left = CASE WHEN l.input_tokens_per_minute IS NULL THEN 0
                ELSE least(l.input_tokens_per_minute, l.input_tokens_left + coalesce(r.granted_input_tokens, 0) - inp - cw)
            END,
            output_tokens_left = CASE WHEN l.output_tokens_per_minute IS NULL THEN 0
                ELSE l.output_tokens_left - outp END,
            updated_at = now()
        WHERE l.rate_limit_key = r.rate_limit_key;
        -- The probe answered (acquire_model_call grants every request of a streak as its probe):
        -- the key works again. An answer to a request granted before the key broke proves
        -- nothing (it was authenticated before the key was revoked or the credit ran out), and
        -- ended every streak at its first step while long streams were still finishing.
        IF bucket.key_errors > 0 AND bucket.key_probe_by = r.id THEN
            PERFORM runrow._key_answered(bucket);
        END IF;
    END IF;
    -- The model answered: the run's 429s since its last answer start again (defer_run's bound,
    -- migration 0109). Written only after a 429, so a settle without one writes nothing more.
    IF r.unanswered_429s > 0 THEN
        UPDATE runrow.agent_run AS a SET unanswered_429s = 0 WHERE a.id = _settle_usage.run_id;
    END IF;
    PERFORM runrow._charge_usage(_settle_usage.run_id, _settle_usage.usage);
END
$fn$;

-- Charge a model call's usage (the caller holds the run row's lock): the run's spend at
-- model_price, the tenant's hour (one model call), and whether a budget was crossed. The
-- call's grant is done with: its estimate and its reservation (acquire_model_call) are
-- cleared. The tenant's budget row is locked before its spend is read, so two runs of one
-- tenant charged at once are checked one after the other and the second sees the first's
-- spend. _settle_usage for an answered call; the reaper for a reserved call whose holder died
-- (the key's buckets are left alone then: the grant took its share of them).
CREATE OR REPLACE FUNCTION runrow._charge_usage(run_id uuid, usage jsonb)
RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    r runrow.agent_run;
    p runrow.model_price;
    inp bigint := runrow._usage_tokens(_charge_usage.usage, 'input_tokens');
    outp bigint := runrow._usage_tokens(_charge_usage.usage, 'output_tokens');
    cw bigint := runrow._usage_tokens(_charge_usage.usage, 'cache_creation_input_tokens');
    cr bigint := runrow._usage_tokens(_charge_usage.usage, 'cache_read_input_tokens');
    -- Of the cache writes, those with the 1-hour TTL, priced apart (twice input, not 1.25x).
    cw_1h bigint := least(cw, runrow._usage_tokens(_charge_usage.usage -> 'cache_creation', 'ephemeral_1h_input_tokens'));
    -- Server tools billed per request on top of their tokens (migration 0076): a missing,
    -- non-object server_tool_use or a count that is not a number counts 0, as a token field.
    searches bigint := runrow._usage_tokens(_charge_usage.usage -> 'server_tool_use', 'web_search_requests');
    fetches bigint := runrow._usage_tokens(_charge_usage.usage -> 'server_tool_use', 'web_fetch_requests');
    cost numeric := 0;
    why text;
BEGIN
    SELECT m.* INTO p FROM runrow.model_price AS m
    WHERE m.model = (SELECT a.model FROM runrow.agent_run AS a WHERE a.id = _charge_usage.run_id);
    IF FOUND THEN
        cost := (inp * p.input_per_mtok + outp * p.output_per_mtok + (cw - cw_1h) * p.cache_write_per_mtok
                 + cw_1h * p.cache_write_1h_per_mtok + cr * p.cache_read_per_mtok) / 1000000
                + searches * p.web_search_per_request + fetches * p.web_fetch_per_request;
    END IF;
    UPDATE runrow.agent_run AS a
    SET spent_tokens = a.spent_tokens + inp + outp + cw + cr,
        spent_cost = a.spent_cost + cost,
        granted_input_tokens = NULL,
        model_call_reserved = NULL,
        model_call_attempt = NULL,
        -- Its own request answered: a key error it gets later is the key's again (migration 0095).
        key_error_answers = NULL,
        updated_at = now()
    WHERE a.id = _charge_usage.run_id
    RETURNING a.* INTO r;

    PERFORM 1 FROM runrow.tenant_budget AS b WHERE b.fairness_key = r.fairness_key FOR UPDATE;
    -- Its reservation leaves the tenant's total as its usage joins the spend (migration 0088).
    PERFORM runrow._tenant_unreserve(_charge_usage.run_id);
    INSERT INTO runrow.spend_hour AS s (
        fairness_key, hour, model, model_calls, input_tokens, output_tokens, cache_write_tokens,
        cache_read_tokens, tokens, cost
    )
    VALUES (coalesce(r.fairness_key, ''), date_trunc('hour', now(), 'UTC'), r.model, 1, inp, outp, cw, cr,
            inp + outp + cw + cr, cost)
    ON CONFLICT ON CONSTRAINT spend_hour_pkey DO UPDATE
    SET model_calls = s.model_calls + 1,
        input_tokens = s.input_tokens + excluded.input_tokens,
        output_tokens = s.output_tokens + excluded.output_tokens,
        cache_write_tokens = s.cache_write_tokens + excluded.cache_write_tokens,
        cache_read_tokens = s.cache_read_tokens + excluded.cache_read_tokens,
        tokens = s.tokens + excluded.tokens,
        cost = s.cost + excluded.cost;

    why := runrow._budget_verdict(r);
    IF why IS NOT NULL THEN
        UPDATE runrow.agent_run AS a SET budget_exhausted = why, updated_at = now() WHERE a.id = _charge_usage.run_id;
    END IF;
END
$fn$;

-- The key answered a request (a usage settled) while it had an API key or account error
-- (report_key_error): the streak is over. Its own block or probe hold is lifted, and so is its
-- hold on queued runs (a claim that met the block set their not_before to its end, as
-- set_rate_limit lifts them). A rate block (a 429's, a response's headers': rate_blocked_until)
-- stays: the key is then blocked to its end, and so are the runs the hold held. Its buckets
-- refill from that end too: a header block reported during the hold (_block_key) put
-- refilled_at at the hold's end, and left there the key granted nothing until the lifted hold
-- would have ended (up to max_block_seconds), its waiters polling every 0.1 s (the review of
-- session 59). The caller holds the key's row lock.
CREATE OR REPLACE FUNCTION runrow._key_answered(l runrow.rate_limit)
RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    -- What is left of the key's block once the hold goes (greatest skips a NULL).
    rest timestamptz := greatest(now(), l.rate_blocked_until);
    own boolean := l.blocked_until > rest AND l.blocked_until = l.key_error_until;
BEGIN
    UPDATE runrow.rate_limit AS b
    SET key_error = NULL, key_errors = 0, key_error_since = NULL, key_error_until = NULL,
        key_error_block = NULL, key_probe_by = NULL,
        -- A request sent after the key's error was answered: a run whose request the key refuses
        -- again since is refused for its own request (report_key_error, migration 0095).
        key_answers = b.key_answers + 1,
        blocked_until = CASE WHEN own THEN rest ELSE b.blocked_until END,
        refilled_at = CASE WHEN own THEN least(b.refilled_at, rest) ELSE b.refilled_at END,
        updated_at = now()
    WHERE b.rate_limit_key = l.rate_limit_key;
    IF own THEN
        PERFORM runrow._lift_held_runs(l.rate_limit_key, l.blocked_until);
    END IF;
END
$fn$;

-- A block of the key that ended early (set_rate_limit removed it, the key error's probe was
-- answered) lifts its hold on queued runs: a claim that met the block set their not_before to
-- its end, so they would stay queued until then. Only a not_before equal to the block's end is
-- the block's; a retry_in backoff keeps its own. Due now, and the dispatchers are woken; or,
-- when a shorter block of the key is still in force (a rate block outlasting the key error's
-- hold), held to its end instead, as a claim would hold them.
CREATE OR REPLACE FUNCTION runrow._lift_held_runs(key text, held_until timestamptz)
RETURNS void
LANGUAGE plpgsql
AS $fn$
DECLARE
    woken uuid;
    held_to timestamptz;
BEGIN
    -- The key's row, then its block if in force: with the test in WHERE the planner could read
    -- every key blocked now through rate_limit_blocked and filter by key (migration 0114).
    SELECT CASE WHEN l.blocked_until > now() THEN l.blocked_until END INTO held_to
    FROM runrow.rate_limit AS l WHERE l.rate_limit_key = _lift_held_runs.key;
    -- SKIP LOCKED: the caller holds the key's row, and a held run another transaction holds is
    -- one a claim took as its hold ended, whose worker waits in acquire_model_call for this key
    -- row while holding the run: waiting on it deadlocked the two (40P01, the review of stop
    -- 57), or one a stop is ending. A claim that holds a run to the block reads the block under
    -- a share lock (_claim_walk), so it waits for this lift and holds nothing to a lifted block.
    -- NO KEY UPDATE, the update's own strength: a journal row's foreign-key check (KEY SHARE)
    -- does not make a run look held.
    WITH held AS (
        SELECT h.id FROM runrow.agent_run AS h
        WHERE h.status = 'queued' AND h.not_before = _lift_held_runs.held_until
          AND h.rate_limit_key = _lift_held_runs.key
        FOR NO KEY UPDATE SKIP LOCKED
    ),

    lifted AS (
        UPDATE runrow.agent_run AS q SET not_before = coalesce(held_to, now()), updated_at = now()
        FROM held
        WHERE q.id = held.id
        RETURNING q.conversation_id
    )
    SELECT min(lifted.conversation_id::text)::uuid INTO woken FROM lifted;
    IF woken IS NOT NULL AND held_to IS NULL THEN
        PERFORM runrow._wake_dispatchers(woken);
    END IF;
END
$fn$;

-- What report_key_error tells the run that met the error, written on the run in one update:
-- its call was refused, and a refusal is not billed, so its reservation goes (a holder killed
-- while it waits out the block was charged for it at the reap: the review of 0080); and the end
-- of the block it is told to wait for is kept, so a deferral for a block lifted before it
-- (a probe answered) ends at once (defer_run, migration 0084); and the key's answers so far,
-- so a refusal after the key answered another run's request is known for the run's own
-- (key_error_answers, migration 0095; NULL without a key row), and the refusal, a 403 that may
-- be the request's (key_error_refused, migration 0099: only the same 403 again is the run's
-- own; NULL for another key error), and when the run's refusals with that 403 began
-- (key_error_first_refused_at, migration 0110: the lone-run rule's age is the run's own): kept
-- while the same 403 comes back with no answer of the key since (its key_error_answers still the
-- key's key_answers: an answer, the key's or the run's own, starts it again, with no write to
-- the key's other runs) and not before the key's streak began; now otherwise. The seconds until
-- then.
CREATE OR REPLACE FUNCTION runrow._key_error_told(run_id uuid, told timestamptz, refused text)
RETURNS numeric
LANGUAGE plpgsql
AS $fn$
DECLARE
    answers bigint;
    since timestamptz;
BEGIN
    SELECT l.key_answers, l.key_error_since INTO answers, since
    FROM runrow.agent_run AS a JOIN runrow.rate_limit AS l ON l.rate_limit_key = a.rate_limit_key
    WHERE a.id = _key_error_told.run_id;
    UPDATE runrow.agent_run AS a
    SET model_call_reserved = NULL, model_call_attempt = NULL, block_told_until = _key_error_told.told,
        key_error_answers = answers,
        key_error_refused = _key_error_told.refused,
        key_error_first_refused_at = CASE
            WHEN _key_error_told.refused IS NULL THEN NULL
            WHEN a.key_error_refused = _key_error_told.refused AND a.key_error_answers = answers
                 AND a.key_error_first_refused_at >= since THEN a.key_error_first_refused_at
            ELSE now() END,
        updated_at = now()
    WHERE a.id = _key_error_told.run_id;
    -- And from its tenant's total; report_key_error holds the key's row already, as a grant would.
    PERFORM runrow._tenant_unreserve(_key_error_told.run_id);
    RETURN round(greatest(extract(EPOCH FROM _key_error_told.told - now()), 0.001), 3);
END
$fn$;

-- Block a key fleet-wide until `until` (a later block is never shortened): from the caller's
-- commit on acquire_model_call grants nothing for the key until then, and the key's requests
-- bucket is emptied and refills only after it, so the fleet does not burst into the wall again.
-- A rate block: its end is kept apart (rate_blocked_until), so a key error's hold lifted
-- (_key_answered) leaves it in force; blocked_until is the later of the two.
-- Creates the key's row (a block-only row) when it has no limits. `refusals`: 429s this report
-- counts (blocks_reported), 1 for report_rate_limited, 0 for report_rate_limit_exhausted (the
-- API said the bucket was empty before it refused anything).
CREATE OR REPLACE FUNCTION runrow._block_key(key text, until timestamptz, by_run uuid, refusals integer)
RETURNS void
LANGUAGE plpgsql
AS $fn$
BEGIN
    INSERT INTO runrow.rate_limit AS l (
        rate_limit_key, blocked_until, rate_blocked_until, blocked_by_run, blocks_reported, refilled_at
    )
    VALUES (_block_key.key, _block_key.until, _block_key.until, _block_key.by_run, _block_key.refusals, _block_key.until)
    ON CONFLICT ON CONSTRAINT rate_limit_pkey DO UPDATE
    SET blocked_until = greatest(l.blocked_until, excluded.blocked_until),
        rate_blocked_until = greatest(l.rate_blocked_until, excluded.rate_blocked_until),
        blocked_by_run = CASE WHEN l.blocked_until >= excluded.blocked_until THEN l.blocked_by_run
            ELSE excluded.blocked_by_run END,
        blocks_reported = l.blocks_reported + _block_key.refusals,
        requests_left = 0,
        paced_full_since = NULL,
        refilled_at = greatest(l.refilled_at, l.blocked_until, excluded.blocked_until),
        updated_at = now();
END
$fn$;

REVOKE ALL ON FUNCTION runrow._require_positive(numeric, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._require_seconds(numeric, text, numeric) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._require_tenant_budget(text, bigint, numeric) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._require_rate_limit(text, integer, integer, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._key_answered(runrow.rate_limit) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._lift_held_runs(text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._lock_bucket(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._usage_tokens(jsonb, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._budget_verdict(runrow.agent_run) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._end_for_budget(uuid, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._tenant_verdict(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._tenant_spent(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._tenant_over(runrow.tenant_budget, numeric, numeric) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._fail_queued_for_budget(uuid, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._settle_usage(uuid, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._charge_usage(uuid, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._key_error_told(uuid, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runrow._block_key(text, timestamptz, uuid, integer) FROM PUBLIC;
