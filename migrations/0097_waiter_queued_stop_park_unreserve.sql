-- depends: 0096_supersede_on_give_back
-- Two defects of the tenant budgets' calls in flight (session 60).
--
-- (A) A tenant's waiter (migration 0091) lost its place under saturation: it was forgotten a
-- minute after its last ask, wherever its run was, and the worker defers a run told
-- budget_reserved for 15 s, after which it waits for a free slot. A fleet that took more than
-- 45 s past the deferral to claim it again dropped it, and smaller calls took the room again:
-- the starvation the waiter was built to stop. A queued waiter now keeps its place until its run
-- has been due for five minutes (not_before while deferred; once promoted by a claim, its last
-- ask); a held one still asks within the minute (functions/_tenant_reservation.sql).
--
-- (B) A stop that ends a claim (_end_stopped) and a park on a person (_park_for_person) left the
-- reservation of a call the claim was granted and never settled in the tenant's total, until a
-- grant that had to wait pruned it; the park left it on the run too, and a reap of the claim
-- after the decision (the same attempt number) charged it. Both take it out now, as finish_run
-- does (functions/_steps_helpers.sql); the rows they left go here.

DELETE FROM runrow.tenant_reservation AS s
WHERE NOT EXISTS (
    SELECT 1 FROM runrow.agent_run AS a
    WHERE a.id = s.run_id AND a.claim_token = s.claim_token
);

UPDATE runrow.agent_run AS a
SET model_call_reserved = NULL, model_call_attempt = NULL, updated_at = now()
WHERE a.status = 'waiting' AND a.model_call_reserved IS NOT NULL;

COMMENT ON COLUMN runrow.tenant_budget.waiter_run IS
'The run whose model call has waited longest for room in the budget (budget_reserved), or NULL: '
'while it waits another call of the tenant goes only if it fits beside the waiter''s '
'reservation (waiter_tokens, waiter_cost) too. Cleared when it is granted; ignored once its run '
'is no longer queued or running, or is running and has not asked for a minute (waiter_seen_at), '
'or is queued and has been due (not_before, else waiter_seen_at) for five minutes.';
COMMENT ON COLUMN runrow.tenant_budget.reserved_tokens IS
'The tokens reserved by the tenant''s granted, unsettled model calls (the sum of its '
'tenant_reservation rows, kept by their trigger): acquire_model_call counts them with the '
'settled spend.';
COMMENT ON COLUMN runrow.tenant_budget.reserved_cost IS
'The USD (at model_price when granted) reserved by the tenant''s granted, unsettled model '
'calls (the sum of its tenant_reservation rows, kept by their trigger).';
COMMENT ON TABLE runrow.tenant_reservation IS
'A model call of a budgeted tenant granted (acquire_model_call) and not yet settled: its '
'reservation (input estimate + max_tokens tokens, priced as uncached input and output) counted '
'in tenant_budget.reserved_tokens and reserved_cost. Removed when the call settles, is charged '
'at the reap, is refused (a 429, a key error), or its claim ends (finished, deferred, released, '
'ended for a budget, stopped, parked on a person); a row whose run no longer holds claim_token '
'is stale, and deleted by the next grant that would wait.';
