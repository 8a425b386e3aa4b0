"""Rows a call reads, counted exactly inside a rolled-back transaction: the measure of the
tests that pin a lookup's plan to the call's own rows (tests/test_last_seq_lookup.py,
tests/test_tool_result_lookup.py, tests/test_append_runs_events_lookup.py).

pg_stat_get_xact_tuples_returned is this backend's own counter for the current transaction: for
an index the entries its scans returned, for a table the rows its sequential scans read. No stats
flush to wait for and nothing the box's load can move.
"""

from __future__ import annotations

import json
import uuid

import psycopg
from race_support import claim, enqueue


def rows_read(conn: psycopg.Connection, table: str, sql: str, params: tuple[object, ...]) -> tuple[int, int]:
    """(entries all of `table`'s indexes returned, rows of `table` read by sequential scans) in the
    most expensive of seven calls of `sql`, each rolled back. Every index, not the one the lookup
    should use: a plan that walks the run through another index and filters must show. Seven
    calls: PL/pgSQL plans a statement anew for each of its first five, then keeps a generic plan
    if it is no dearer, and either must read what the call needs and no more."""
    counts = []
    read = (
        "SELECT (SELECT sum(pg_stat_get_xact_tuples_returned(i.indexrelid))::bigint"
        " FROM pg_index AS i WHERE i.indrelid = %(table)s::regclass),"
        " pg_stat_get_xact_tuples_returned(%(table)s::regclass)"
    )
    for _ in range(7):
        with conn.transaction(force_rollback=True):
            before = conn.execute(read, {"table": f"runrow.{table}"}).fetchone()
            conn.execute(sql, params)
            after = conn.execute(read, {"table": f"runrow.{table}"}).fetchone()
        counts.append((after[0] - before[0], after[1] - before[1]))
    # Each figure's own worst: a max of the pairs would let a custom plan's index entries hide
    # a generic plan's sequential scan.
    return max(e for e, _ in counts), max(r for _, r in counts)


def one_step_history(conn: psycopg.Connection, runs: int = 1000) -> None:
    """A fleet's history as ANALYZE sees it: `runs` runs of one text turn each (at most 1,000,
    one claim), then agent_step and run_event analyzed. Large enough that the planner does not
    take the tables for tiny and scan them whole."""
    for _ in range(runs):
        enqueue(conn, uuid.uuid4())
    turn = json.dumps([{"type": "text", "text": "a step"}])
    for run in claim(conn, runs, lease_seconds=600):
        conn.execute(
            "SELECT runrow.append_step(%s, %s, 'model_turn', %s::json)",
            (run["run_id"], run["claim_token"], turn),
        )
    conn.execute("ANALYZE runrow.agent_step, runrow.run_event")
