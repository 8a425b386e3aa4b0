-- depends: 0091_budget_waiter_pace_full
-- Three defects of the fleet limits (session 60).
--
-- (A) A header block's pace (report_rate_limit_exhausted with requests_limit, migration 0087)
-- was invisible: rate_limits showed a paced key as one with no requests limit, so an operator
-- could not tell its requests were held to one every reset_in_seconds. The view gains
-- paced_interval (appended: CREATE OR REPLACE keeps the existing columns in order).
--
-- (B) set_rate_limit left the pace on the key: a requests limit the operator set did not replace
-- it (it was only shadowed, and came back when the limit was removed again). set_rate_limit now
-- clears it (functions/set_rate_limit.sql); the paces it left under a requests limit go here.
--
-- (C) finish_runs and finish_and_claim_runs now take out the reservation of a call granted and
-- never settled, as finish_run does (functions/finish_runs.sql, _tenant_unreserve_runs): the
-- reserved totals' comments no longer name them among the endings that leave one.

CREATE OR REPLACE VIEW runrow.rate_limits AS
WITH e AS (
    SELECT
        l.*,
        greatest(0, extract(EPOCH FROM now() - l.refilled_at)) AS secs
    FROM runrow.rate_limit AS l
)

SELECT
    e.rate_limit_key,
    e.requests_per_minute,
    e.input_tokens_per_minute,
    e.output_tokens_per_minute,
    least(e.requests_per_minute, e.requests_left + e.requests_per_minute * e.secs / 60) AS requests_left,
    least(e.input_tokens_per_minute, e.input_tokens_left + e.input_tokens_per_minute * e.secs / 60) AS input_tokens_left,
    least(e.output_tokens_per_minute, e.output_tokens_left + e.output_tokens_per_minute * e.secs / 60)
        AS output_tokens_left,
    CASE WHEN e.blocked_until > now() THEN e.blocked_until END AS blocked_until,
    CASE WHEN e.blocked_until > now() THEN e.blocked_until - now() END AS block_time_left,
    e.blocks_reported,
    e.key_error,
    e.key_errors,
    make_interval(secs => round(60 / e.paced_requests_per_minute, 3)::double precision) AS paced_interval
FROM e;

COMMENT ON VIEW runrow.rate_limits IS
'Every rate-limit key: its per-minute limits, what each bucket holds now, the block in force, '
'an API key or account error that has not cleared (key_error, key_errors), and the pace a header '
'block set on a key with no requests limit of its own (paced_interval: one request per that '
'interval, until the bucket has stood full for one; NULL when not paced).';

-- A view replaced keeps its grants; said again so this file reads whole.
GRANT SELECT ON runrow.rate_limits TO runrow_auditor;

-- A pace shadowed by a requests limit set after it: what set_rate_limit now clears.
UPDATE runrow.rate_limit AS l
SET paced_requests_per_minute = NULL, paced_requests_limit = NULL, paced_full_since = NULL
WHERE l.requests_per_minute IS NOT NULL AND l.paced_requests_per_minute IS NOT NULL;

COMMENT ON COLUMN runrow.tenant_budget.reserved_tokens IS
'The tokens reserved by the tenant''s granted, unsettled model calls (the sum of its '
'tenant_reservation rows, kept by their trigger): acquire_model_call counts them with the '
'settled spend. May include claims ended by a stop or a park on a person with their call '
'unsettled, until a grant that would wait prunes them.';
COMMENT ON COLUMN runrow.tenant_budget.reserved_cost IS
'The USD (at model_price when granted) reserved by the tenant''s granted, unsettled model '
'calls (the sum of its tenant_reservation rows, kept by their trigger); may include ended '
'claims, as reserved_tokens.';
