-- depends: 0113_tenant_budgets_by_key
-- The keys blocked now, read through an index of blocked_until instead of every key's row.
--
-- Why: every claim that finds a run asks which keys are blocked now (`blocked_until > now()`):
-- the fast path's NOT EXISTS and the walk's array of blocked keys (functions/_claim_walk.sql),
-- and queue_metrics' rate_limit_keys_blocked and the rate_limit_blocks view ask the same
-- (metrics scrapes, runrow status). With no index of blocked_until each was a sequential scan
-- of runrow.rate_limit, which keeps a row for every key ever given limits (set_rate_limit) or
-- ever blocked (_block_key, on any 429 or exhausted-bucket header; report_key_error: the key is
-- the model unless runs are enqueued with one, e.g. per customer), and removes one only when an
-- operator removes the key. Found by a plan audit of the hot paths (stop 62). Counted with
-- tests/test_blocked_keys_lookup.py, rows of rate_limit read by one claim that finds a run:
-- 10 keys, 10 rows; 3,010 keys (half limited, half blocked once by a 429 long over), 3,010
-- rows, on the one-tenant fast path and on the walk alike, with stale or fresh statistics; with
-- the index 0 entries and 0 rows in both shapes, custom and generic plans.
--
-- Partial (blocked_until IS NOT NULL): a key never blocked (limits only) has no entry, and
-- `blocked_until > now()` implies the predicate, so every reader above uses it. At 3,010 keys,
-- 1,505 of them blocked once: 32 kB, beside the table's 344 kB.
--
-- Writes: an UPDATE that changes blocked_until is no longer HOT, and one entry is added. Those
-- are the block's own writes: _block_key (a 429, a response saying the requests bucket is
-- empty), report_key_error, acquire_model_call's probe grant during a key error streak and
-- _key_answered lifting its hold: one per write that moves the block (a 429 that extends it,
-- each probe grant of a key error streak), so bounded by the requests a block meets, not paid
-- by the requests that run while the key is open. The per-request bucket
-- writes (_lock_bucket's refill, acquire_model_call's draw, the settlement in append_step) set
-- blocked_until to itself or not at all, and stay HOT: 800 of 800 updates of a limited key's
-- row were HOT over 200 grants and settlements, with and without the index. (A non-HOT write
-- also leaves the key's old rate_limit_pkey entry for the next lookups to step over until one
-- marks it dead: defer_run read 2 entries, then 1.)
--
-- The lookups of one key's block: acquire_model_call, report_key_error and the claim's re-read
-- of a candidate's key name the key alone. defer_run and _lift_held_runs said `key = k AND
-- blocked_until > now()`, and the planner took that as a range of this index filtered by key:
-- with 202 keys blocked now, 202 and 204 entries where the key's one entry of rate_limit_pkey
-- does (tests/test_blocked_keys_lookup.py; 5,000 keys, most never blocked, gave the same plan
-- in a new session). Both now test the block on the key's row (functions/defer_run.sql,
-- functions/_limits_helpers.sql): one entry, as before this migration.
--
-- A plain CREATE INDEX: rate_limit has a row per key, so the SHARE lock that makes grants and
-- settlements wait lasts as long as reading a few thousand rows.

CREATE INDEX rate_limit_blocked ON runrow.rate_limit (blocked_until) WHERE blocked_until IS NOT NULL;

COMMENT ON INDEX runrow.rate_limit_blocked IS
'The keys blocked now (blocked_until > now()), for every claim that finds a run and for '
'queue_metrics: read without visiting the rows of keys never blocked or blocked in the past '
'(migration 0114).';
