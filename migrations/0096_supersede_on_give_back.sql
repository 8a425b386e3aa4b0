-- depends: 0095_key_error_own_request
-- A claim handed back with its attempt given back (defer_run after a key error, a rate limit or
-- a budget wait; _park_for_person) is followed by a claim of the same attempt number, and a
-- resumed attempt 1 takes nothing back (pyworker/worker/supersede.py looks from attempt 2 on).
-- So the deltas of a model turn cut off by a key error mid-stream, then deferred, stayed in
-- what a tail, the SSE service and the chat page show: the journal said text_delta,
-- run_requeued, run_claimed, text_delta, with no superseded event, and 234 characters streamed
-- for a 210-character result (the worker audit). The hand-back now journals the superseded
-- event itself (functions/_supersede.sql, runrow._superseded_event). This migration is the
-- version that says so (`runrow migrate` applies functions/ after it).

COMMENT ON SCHEMA runrow IS
'runrow: durable AI-agent runs (migrations and functions/ of the runrow package; '
'runrow.schema_version() names the newest migration applied).';
