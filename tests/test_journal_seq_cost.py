"""What a journal row costs in lookups of its run's last seq: exactly one (invariant 4's
guard trigger assigns the next seq and is the only reader), for every batched writer.

Counted as index scans of run_event_pkey inside one call (pg_stat_get_xact_numscans reads
this backend's own counters, exact within a transaction, no stats flush to wait for), and
in shared buffers (EXPLAIN ANALYZE BUFFERS), never in time. Every call is rolled back, so
each measurement starts from the same journal.
"""

from __future__ import annotations

import json
import uuid

import psycopg
from lifecycle_support import completed
from race_support import Connect, database_url, drain, enqueue, owner

RUNS = 10
EVENTS = 10

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer


def journal_cost(conn: psycopg.Connection, sql: str, params: tuple[object, ...] = ()) -> tuple[int, int]:
    """(run_event_pkey scans, shared buffers) of one call, rolled back. The lowest of the
    last four of ten: PL/pgSQL plans a statement anew for each of its first five runs, and
    planning may probe the index too; the steady cost is the one after them."""
    counts: list[tuple[int, int]] = []
    scans = "SELECT pg_stat_get_xact_numscans('runrow.run_event_pkey'::regclass)"
    for _ in range(10):
        with conn.transaction(force_rollback=True):
            before = conn.execute(scans).fetchone()[0]
            plan = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params).fetchone()[0][0][
                "Plan"
            ]
            after = conn.execute(scans).fetchone()[0]
        counts.append((after - before, plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]))
    return min(counts[6:])


def test_each_journal_row_costs_one_lookup_of_the_last_seq(owner: psycopg.Connection, connect: Connect):
    for _ in range(RUNS):
        enqueue(owner, uuid.uuid4())
    worker = connect()
    claim_scans, claim_buffers = journal_cost(
        worker, "SELECT * FROM runrow.claim_runs('cost-probe', %s, 30)", (RUNS,)
    )

    runs = worker.execute(
        "SELECT run_id, claim_token FROM runrow.claim_runs('cost-probe', %s, 30)", (RUNS,)
    ).fetchall()
    assert len(runs) == RUNS
    events = json.dumps([{"type": "text_delta", "text": str(n)} for n in range(EVENTS)])
    append_scans, append_buffers = journal_cost(
        worker, "SELECT runrow.append_events(%s, %s, %s::jsonb)", (runs[0][0], runs[0][1], events)
    )
    finish = completed(runs)
    finish_scans, finish_buffers = journal_cost(
        worker, "SELECT * FROM runrow.finish_runs(%s::jsonb)", (finish,)
    )
    print(
        f"run_event_pkey scans / shared buffers per call: claim_runs({RUNS}) {claim_scans} / {claim_buffers},"
        f" append_events of {EVENTS} events {append_scans} / {append_buffers},"
        f" finish_runs of {RUNS} runs {finish_scans} / {finish_buffers}"
    )
    drain(owner)

    # One run_claimed per claimed run, the events, one complete per finished run: the rows
    # each call journals, and so the lookups of a last seq it needs, at most.
    assert (claim_scans, append_scans, finish_scans) == (RUNS, EVENTS, RUNS)
