"""A tool call costs the same at a run's 150th tool result as at its 10th.

begin_tool_call (is this tool_use already answered?) and append_step's model_turn (has every
tool_use of the last turn its result?) look a tool_use's result up by (run_id, tool_use_id) in
agent_step_one_result_per_tool_use. Written as NOT EXISTS, the planner made each an anti join
that matched the id in a join filter over every tool result of the run, under any statistics:
a tool-heavy agent run paid quadratically in its tool calls. Found by a plan audit of the hot
paths (stop 62); a scalar probe (`(SELECT 1 … LIMIT 1) IS NULL`, as _claim_batch_step's) reads
one entry.

Counted, not timed: entries agent_step's indexes returned inside one rolled-back call
(lookup_cost_support.rows_read), at two lengths of the same run, each in a fresh session.
"""

from __future__ import annotations

import json
import uuid

import psycopg
from lookup_cost_support import one_step_history, rows_read
from race_support import Connect, claim_one, database_url, enqueue, owner
from steps_support import append_step, tool_turn

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer

ARGS = {"city": "Paris"}
SHORT, LONG = 10, 150
DONE = json.dumps([{"type": "text", "text": "done"}])
NEXT_TURN = f"SELECT runrow.append_step(%s, %s, 'model_turn', '{DONE}'::json)"


def test_a_tool_calls_lookup_of_its_result_reads_one_entry_however_many_results_the_run_has(
    owner: psycopg.Connection, connect: Connect
) -> None:
    one_step_history(owner)
    enqueue(owner, uuid.uuid4(), tools=("weather",))
    run = claim_one(owner, lease_seconds=600)
    run_id, token = run["run_id"], run["claim_token"]
    cost: dict[int, dict[str, tuple[int, int]]] = {}
    answered = 0
    for length in (SHORT, LONG):
        for n in range(answered, length):
            tool_turn(owner, run_id, token, f"tu_{n}", "weather", ARGS)
            result = {"type": "tool_result", "tool_use_id": f"tu_{n}", "content": "sunny"}
            assert append_step(owner, run_id, token, "tool_result", json.dumps(result)) is not None
        answered = length
        with connect() as session:
            # The next turn, after a turn whose tool_use has its result.
            cost[length] = {"append_step": rows_read(session, "agent_step", NEXT_TURN, (run_id, token))}
            # A turn asking for one more call, then that call begun (rolled back with it).
            with session.transaction(force_rollback=True):
                key = tool_turn(session, run_id, token, "tu_next", "weather", ARGS)
                begin = (
                    "SELECT state FROM runrow.begin_tool_call(%s, %s, %s, 'weather', %s::jsonb, 'idempotent')"
                )
                cost[length]["begin_tool_call"] = rows_read(
                    session, "agent_step", begin, (run_id, token, key, json.dumps(ARGS))
                )
    print(f"(entries of agent_step's indexes, rows seq-scanned) per call: {cost}")
    # At e830cbe: append_step (33, 0) then (360, 0), begin_tool_call (12, 0) then (152, 0). After: a
    # handful of point lookups (the run's last model turn, the result probe, the guard's).
    for call in ("append_step", "begin_tool_call"):
        assert cost[LONG][call] == cost[SHORT][call], call
        entries, scanned = cost[LONG][call]
        assert entries <= 5 and scanned == 0, call
