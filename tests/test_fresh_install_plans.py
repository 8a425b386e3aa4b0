"""A fresh install plans agent_run's lookups as index scans, and keeps them while it fills.

PostgreSQL guesses at least 10 pages for a table never vacuumed; one whose pg_class says it
is empty (reltuples 0, as a CLUSTER of the empty table left it in migration 0029) is planned
as empty. The lifecycle's statements are cached as generic plans in each session, so a
session that first ran them on the empty table kept sequential scans of agent_run for every
lookup by key until the table's first ANALYZE: a bulk enqueue of n runs in one transaction
read about 1.5 n^2 rows (2,000 runs: 6 million), and a worker started on an empty table
scanned the whole of it on every heartbeat, append and finish.

Counted, not timed: pg_stat_user_tables.seq_tup_read of agent_run, the rows read by
sequential scans.
"""

from __future__ import annotations

import psycopg
from lifecycle_support import ENQUEUE, completed
from stats_support import agent_run_updates, counter, flushed
from worker_support import db, worker_db

__all__ = ["db", "worker_db"]

CLAIM = "SELECT run_id, claim_token FROM runrow.claim_runs(worker_id => 'fresh', max_runs => 10)"


def seq_rows_read(conn: psycopg.Connection) -> int:
    """Rows of agent_run read by sequential scans so far, this session's included."""
    flushed(conn)
    return counter(
        conn, "SELECT seq_tup_read FROM pg_stat_user_tables WHERE relid = 'runrow.agent_run'::regclass"
    )


def lifecycle(conn: psycopg.Connection, runs: list[tuple[object, object]]) -> None:
    """The rest of a claimed batch's life: a heartbeat and an append for its first run, then
    every run finished."""
    assert conn.execute("SELECT owned FROM runrow.heartbeat(%s, %s, 30)", runs[0]).fetchone() == (True,)
    conn.execute('SELECT runrow.append_events(%s, %s, \'[{"type": "x"}]\'::jsonb)', runs[0])
    finished = conn.execute(
        "SELECT finished FROM runrow.finish_runs(%s::jsonb)", (completed(runs),)
    ).fetchall()
    assert all(f for (f,) in finished)


def test_a_fresh_agent_run_is_planned_as_never_vacuumed(db: psycopg.Connection) -> None:
    row = db.execute(
        "SELECT relpages, reltuples FROM pg_class WHERE oid = 'runrow.agent_run'::regclass"
    ).fetchone()
    assert row == (0, -1), f"agent_run's pg_class size after migrating: {row} (never vacuumed: (0, -1))"


def test_a_bulk_enqueue_in_one_transaction_reads_no_rows_by_sequential_scan(db: psycopg.Connection) -> None:
    before = seq_rows_read(db)
    assert db.execute(ENQUEUE, (2000,)).fetchone() == (2000,)
    # Before the fix: 5,999,000 (three lookups per enqueue, each a scan of the runs so far).
    assert seq_rows_read(db) - before == 0


def test_a_session_warmed_on_the_empty_table_drains_without_sequential_scans(
    db: psycopg.Connection, worker_db: str
) -> None:
    with psycopg.connect(worker_db, autocommit=True) as warm:
        # Past PL/pgSQL's five custom-plan tries: from here on each statement of the lifecycle
        # runs the generic plan it cached while agent_run held a run or two.
        for _ in range(8):
            assert warm.execute(CLAIM).fetchall() == []
            db.execute(ENQUEUE, (1,))
            runs = warm.execute(CLAIM).fetchall()
            lifecycle(warm, runs)
        db.execute(ENQUEUE, (1000,))
        before = seq_rows_read(warm)
        updates = agent_run_updates(warm)
        drained = 0
        while runs := warm.execute(CLAIM).fetchall():
            lifecycle(warm, runs)
            drained += len(runs)
        assert drained == 1000
        read = seq_rows_read(warm) - before  # flushes this session's counts
        # They do reach the reader: every run was updated twice (claimed, finished).
        assert agent_run_updates(warm) - updates >= 2 * drained
        # Before the fix: 0.3 to 2.3 million (heartbeat, append's fence, finish_runs and the
        # after-update trigger each scanning the table, 100 times over).
        assert read == 0


def test_a_session_warmed_on_the_empty_table_drains_through_one_call_without_sequential_scans(
    db: psycopg.Connection, worker_db: str
) -> None:
    """The same through finish_and_claim_runs, which pins the claim's plan settings for the walk
    it shares with _claim (the walk carries none of its own) and for its one UPDATE."""
    one_call = (
        "SELECT run_id, finished, claim_token"
        " FROM runrow.finish_and_claim_runs(%s::jsonb, worker_id => 'fresh', max_runs => 10)"
    )

    def cycle(conn: psycopg.Connection, runs: list) -> list:
        with conn.transaction():
            rows = conn.execute(one_call, (completed(runs),)).fetchall()
        assert all(f for _, f, _ in rows if f is not None)
        return [(r, t) for r, f, t in rows if f is None]

    with psycopg.connect(worker_db, autocommit=True) as warm:
        runs: list = []
        for _ in range(8):
            runs = cycle(warm, runs)
            db.execute(ENQUEUE, (1,))
        runs = cycle(warm, runs)
        db.execute(ENQUEUE, (1000,))
        before = seq_rows_read(warm)
        drained = 0
        while True:
            drained += len(runs)
            runs = cycle(warm, runs)
            if not runs:
                break
        assert drained >= 1000
        assert seq_rows_read(warm) - before == 0
