"""A batched append reaches its runs by key, however many runs the table holds.

append_runs_events joins the batch's JSON to agent_run on (id, claim_token). On a small table
(a new install, a few thousand runs) the planner made that a hash join whose outer side was a
full scan of agent_run_pkey: a one-run flush read every entry (1,990 at 1,000 running runs).
Found by a plan audit of the hot paths (stop 62); the statement now also says `r.id = ANY (ids)`,
which keeps it a probe by key under any statistics.

Counted, not timed: entries of agent_run's indexes and agent_run rows seq-scanned inside one
rolled-back call (lookup_cost_support.rows_read), at 10 and 1,000 running runs, each in a fresh
session.
"""

from __future__ import annotations

import json
import uuid

import psycopg
from lookup_cost_support import rows_read
from race_support import Connect, claim, database_url, enqueue, owner

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer

SMALL, LARGE = 10, 1000
APPEND = "SELECT * FROM runrow.append_runs_events(%s::jsonb)"


def test_a_one_run_flush_reads_its_run_by_key_however_many_runs_are_running(
    owner: psycopg.Connection, connect: Connect
) -> None:
    running: list[dict] = []
    cost = {}
    for size in (SMALL, LARGE):
        for _ in range(size - len(running)):
            enqueue(owner, uuid.uuid4())
        running += claim(owner, size - len(running), lease_seconds=600)
        assert len(running) == size
        owner.execute("ANALYZE runrow.agent_run")  # as autovacuum would, after a burst of claims
        batch = json.dumps(
            [
                {
                    "run_id": str(running[0]["run_id"]),
                    "claim_token": str(running[0]["claim_token"]),
                    "events": [{"type": "text_delta", "text": "a word"}],
                }
            ]
        )
        with connect() as session:
            cost[size] = rows_read(session, "agent_run", APPEND, (batch,))
    print(f"(entries of agent_run's indexes, rows seq-scanned) per one-run flush: {cost}")
    # Before the fix: (20, 0) at 10 running runs and (1990, 0) at 1,000: every entry of
    # agent_run_pkey, about twice.
    for size, (entries, scanned) in cost.items():
        assert entries <= 2 and scanned == 0, size
