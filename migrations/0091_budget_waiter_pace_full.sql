-- depends: 0090_queue_metrics_blocked
-- Two defects of the fleet limits (the review of session 59).
--
-- (A) A tenant's large model call starved near its budget: acquire_model_call made a call that
-- would carry the tenant's settled spend plus its calls in flight past the budget wait
-- (budget_reserved) while another call was in flight, so smaller calls taking turns in flight
-- kept a large one waiting forever (30 polls, never granted). The tenant's first waiting call is
-- now kept on its budget row (waiter_run, what it reserves: waiter_tokens, waiter_cost, and its
-- latest ask: waiter_seen_at); while it waits, another call of the tenant goes only if it fits
-- beside the waiter's reservation too, so the calls in flight drain and the waiter goes. A
-- waiter is forgotten when granted, when its run is no longer queued or running, or when it has
-- not asked for a minute. And budget_reserved answered a wait of 1 s, under the worker's
-- in-place limit (rate_limit_max_wait, 10 s): every waiting run kept its lease and worker slot,
-- so a tenant near its budget occupied fleet slots; the wait is 15 s now, and the worker defers
-- the run instead (functions/_tenant_reservation.sql).
--
-- (B) A header block's pace never ended while anything touched the key's bucket: _lock_bucket
-- ended it only when one gap between two locks of the bucket was as long as a request's refill,
-- and settles and waiting polls lock it too. The bucket's first moment full is kept
-- (paced_full_since, cleared by a grant that takes from it): the pace ends once it has stood
-- full for one more request's time, however often it is locked meanwhile (_lock_bucket).
--
-- (C) A refused call's reservation outlived its claim: finish_run (and a run ended for its
-- budget) now take it out; finish_runs and the stops still leave it, so the total may count
-- ended claims until a grant that would wait prunes them (the comments below say so).

ALTER TABLE runrow.tenant_budget
ADD COLUMN waiter_run uuid,
ADD COLUMN waiter_tokens bigint,
ADD COLUMN waiter_cost numeric,
ADD COLUMN waiter_seen_at timestamptz;

COMMENT ON COLUMN runrow.tenant_budget.waiter_run IS
'The run whose model call has waited longest for room in the budget (budget_reserved), or NULL: '
'while it waits another call of the tenant goes only if it fits beside the waiter''s '
'reservation (waiter_tokens, waiter_cost) too. Cleared when it is granted; ignored once its run '
'is no longer queued or running or it has not asked for a minute (waiter_seen_at).';
COMMENT ON COLUMN runrow.tenant_budget.waiter_tokens IS
'The tokens the waiting call (waiter_run) would reserve.';
COMMENT ON COLUMN runrow.tenant_budget.waiter_cost IS
'The USD (at model_price) the waiting call (waiter_run) would reserve.';
COMMENT ON COLUMN runrow.tenant_budget.waiter_seen_at IS
'When the waiting call (waiter_run) last asked (acquire_model_call).';

ALTER TABLE runrow.rate_limit
ADD COLUMN paced_full_since timestamptz;

COMMENT ON COLUMN runrow.rate_limit.paced_full_since IS
'While a header block''s pace is on (paced_requests_per_minute): since when the paced requests '
'bucket has stood full with nobody drawing on it (a grant clears it); the pace ends once that '
'is one request''s time (_lock_bucket).';

COMMENT ON COLUMN runrow.tenant_budget.reserved_tokens IS
'The tokens reserved by the tenant''s granted, unsettled model calls (the sum of its '
'tenant_reservation rows, kept by their trigger): acquire_model_call counts them with the '
'settled spend. May include claims ended by finish_runs or a stop with their call unsettled, '
'until a grant that would wait prunes them.';
COMMENT ON COLUMN runrow.tenant_budget.reserved_cost IS
'The USD (at model_price when granted) reserved by the tenant''s granted, unsettled model '
'calls (the sum of its tenant_reservation rows, kept by their trigger); may include ended '
'claims, as reserved_tokens.';
