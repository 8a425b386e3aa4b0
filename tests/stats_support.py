"""Reading PostgreSQL's cumulative statistics exactly, for tests that count instead of time.

A backend keeps its counts to itself until it flushes them to shared memory: as it goes idle,
at most once a second, unless forced. After `flushed(conn)` the flush has happened (forced, it
runs as the session goes idle after that statement, before it answers), so a count read from
any session is exact. A reading session keeps what it read for its transaction unless it
clears that snapshot first, which `counter` does.
"""

from __future__ import annotations

import psycopg


def flushed(conn: psycopg.Connection) -> None:
    """Every count of `conn`'s backend so far is in shared memory when this returns."""
    conn.execute("SELECT pg_stat_force_next_flush()")


def counter(observer: psycopg.Connection, sql: str, params: tuple[object, ...] = ()) -> int:
    """One cumulative counter (`sql` selects one row, one column), read afresh."""
    observer.execute("SELECT pg_stat_clear_snapshot()")
    row = observer.execute(sql, params).fetchone()
    assert row is not None, f"no statistics row for: {sql}"
    return int(row[0])


def agent_run_updates(observer: psycopg.Connection) -> int:
    """Rows of agent_run updated so far, as flushed: the control that a test's counts reach
    the reader at all (a count that never moved would pass any "== 0" assertion)."""
    return counter(
        observer, "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'runrow.agent_run'::regclass"
    )


def index_entries_read(observer: psycopg.Connection, index: str) -> int:
    """Entries that scans of `index` (a qualified name) have returned so far, every session's
    (pg_stat_user_indexes.idx_tup_read)."""
    return counter(
        observer, "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelid = %s::regclass", (index,)
    )


def index_scans(observer: psycopg.Connection, index: str) -> int:
    """Scans of `index` started so far, every session's (pg_stat_user_indexes.idx_scan)."""
    return counter(
        observer, "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelid = %s::regclass", (index,)
    )
