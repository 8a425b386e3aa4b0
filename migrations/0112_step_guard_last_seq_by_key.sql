-- depends: 0111_webhook_lapsed_token_validated
-- agent_step's guard reads its run's last seq as the journal's guard has since 0047: the key's
-- last entry (ORDER BY seq DESC LIMIT 1), not max(seq).
--
-- Why: max(seq) has two plans, the backward probe of agent_step_pkey that reads one entry and
-- an aggregate over every entry of the run, and the planner takes the aggregate whenever it
-- expects about one row per run, which is what ANALYZE learns from a fleet of one-step chat
-- turns. Every step of a long agent run then read all the run's earlier steps (and their heap
-- tuples while the visibility map lags): quadratic in the run's length. The ordered form has
-- one sensible plan under any statistics (tests/test_last_seq_lookup.py).
--
-- Found by bench.api_calls: one more column on agent_step changed the never-analyzed table's
-- width-based row estimate, flipped the plan, and cost +315,000 instructions per append_step
-- at 300 steps. Measured: see the commit message.
--
-- Unchanged: gap-free seqs from 1, append-only, tool_use_id derived from the payload.

CREATE OR REPLACE FUNCTION runrow._agent_step_guard() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
DECLARE
    expected integer;
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- Invariant 4: the next seq, no gap, no reuse. A NULL seq is the writers' way: it is
        -- given the next one (0051). Ordered, not max(): one plan whatever the statistics.
        SELECT s.seq + 1 INTO expected
        FROM runrow.agent_step AS s WHERE s.run_id = NEW.run_id
        ORDER BY s.seq DESC
        LIMIT 1;
        expected := coalesce(expected, 1);
        IF NEW.seq IS NULL THEN
            NEW.seq := expected;
        ELSIF NEW.seq <> expected THEN
            RAISE EXCEPTION 'agent_step seq % for run % is out of order: expected %', NEW.seq, NEW.run_id, expected
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        -- Derived, whatever the INSERT said, so it cannot disagree with the payload.
        NEW.tool_use_id := CASE
            WHEN NEW.kind = 'tool_result' THEN runrow._json_probe(NEW.payload) ->> 'tool_use_id'
        END;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'agent_step is append-only: rows cannot be %d', lower(TG_OP)
        USING ERRCODE = 'integrity_constraint_violation',
              HINT = 'Steps are the record of a run; a correction is a new step.';
END
$fn$;

COMMENT ON FUNCTION runrow._agent_step_guard() IS
'agent_step''s BEFORE INSERT OR UPDATE OR DELETE row trigger. INSERT: invariant 4, the run''s next '
'seq (its last + 1, read as the key''s last entry so that one plan serves any statistics, 0112): '
'a NULL seq is assigned it (the writers leave it NULL and read it back with RETURNING, 0051), '
'any other seq must be it or raises 23000; tool_use_id is derived from a tool_result''s payload. '
'UPDATE and DELETE always raise 23000 (append-only).';
