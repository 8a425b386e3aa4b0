-- depends: 0037_ending_wakes_only_when_one_can_start
-- A claim returns only runs whose claim stands (a correctness fix in _claim).
--
-- Why: _claim's final statement (the claiming UPDATE, its journal INSERT, the claimed rows)
-- ran as RETURN QUERY inside the block whose handler turns a collision (invariant 1, the
-- turn-order guard, a concurrency limit, a journal row taken meanwhile) into "claim nothing
-- this round". But PL/pgSQL keeps the rows a RETURN QUERY has already handed over when the
-- statement then fails and the function's own handler catches the error, and the journal
-- INSERT (a CTE the result does not read) and agent_run's AFTER statement trigger run only
-- after the rows are out. So a collision caught there returned the runs and claim tokens the
-- rollback had taken back (tests/test_claim_rolled_back.py), and a worker would have started
-- runs it did not hold. Now the statement gathers the claimed rows into an array of this type,
-- and the function returns them after the block, once the statement has succeeded. _claim
-- returns SETOF this type, so its row shape is written once; a function's return type cannot be
-- replaced in place, so the old _claim goes here (a fresh install has none yet) and
-- functions/_claim.sql creates the new one.

CREATE TYPE runrow.claimed_run AS (
    run_id uuid,
    claim_token uuid,
    conversation_id uuid,
    attempt integer,
    max_attempts integer,
    model text,
    prompt_id text,
    system_prompt text,
    tools jsonb,
    user_id text,
    user_message_id uuid,
    metadata jsonb,
    claim_expires_at timestamptz,
    queued_seconds double precision
);

COMMENT ON TYPE runrow.claimed_run IS
'One run as claim_run and claim_runs return it. _claim gathers its claimed rows into an array '
'of this type and returns them only once its claiming statement has succeeded.';

DROP FUNCTION IF EXISTS runrow._claim(text, integer, integer);
