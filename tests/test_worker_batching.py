"""More slots must cost less per run, not more: a worker at --concurrency 10 acknowledges its
runs in group commits (run endings and every run's journal in one transaction per flush,
followers joining the group in flight, claims filling every free slot), so the database
commits per run fall well below those at --concurrency 1.

Counted, not timed: pg_stat_database.xact_commit of the test's own database over the drain,
read once every backend of the worker has exited (a backend flushes its statistics on exit).
The database is vacuumed and analyzed, catalogs included, before the count starts: migrating
it leaves ten catalogs (pg_attribute, pg_depend, pg_class, ...) past autovacuum's thresholds,
and an autovacuum visit inside the window, a transaction or two per catalog, read 1.05
transactions per run as 1.16-1.23 in about one full-suite run in five.
The polling connection's own commits are counted and taken off, and autovacuum is off for the
test database's tables while it drains: a busy box (a whole suite beside it) otherwise has
autovacuum vacuum and analyze the drained tables inside the window, each table its own
transaction, which is load, not the worker. The worker's own transactions
are counted with its LISTEN session in another database: PostgreSQL wakes a listener (one
transaction) on every notifying commit, which is a cost of the listener, not of the worker."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import make_conninfo
from stats_support import counter, flushed
from worker_support import db, enqueue_echo, start_worker, wait_until, worker_db

__all__ = ["db", "start_worker", "worker_db"]

RUNS = 200


class Poller:
    """A connection to the test's database that counts the transactions it commits there."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.commits = 0

    def one(self, sql: str) -> object:
        self.commits += 1
        row = self.conn.execute(sql).fetchone()
        assert row is not None
        return row[0]

    def close(self) -> None:
        self.one("SELECT pg_stat_force_next_flush()")  # its own counts land before it answers
        self.conn.close()


def commits(observer: psycopg.Connection, datname: str) -> int:
    return counter(observer, "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (datname,))


def settled_commits(observer: psycopg.Connection, datname: str, others: int) -> int:
    """xact_commit once only `others` backends are left in the database and the count has
    stopped moving (an exiting backend leaves pg_stat_activity just before it flushes)."""
    wait_until(
        lambda: observer.execute(
            "SELECT count(*) <= %s FROM pg_stat_activity WHERE datname = %s", (others, datname)
        ).fetchone()[0],
        30,
        "the worker's backends to exit",
    )
    last = commits(observer, datname)
    while True:
        time.sleep(0.3)
        now = commits(observer, datname)
        if now == last:
            return now
        last = now


@contextlib.contextmanager
def autovacuum_off(db: psycopg.Connection) -> Iterator[None]:
    """No autovacuum of the runrow tables (the database's own) while the block runs."""
    tables = [
        name
        for (name,) in db.execute(
            "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'runrow' AND c.relkind = 'r'"
        ).fetchall()
    ]
    for name in tables:
        db.execute(f"ALTER TABLE {name} SET (autovacuum_enabled = off)")
    flushed(db)  # these commits land before the count starts
    try:
        yield
    finally:
        for name in tables:
            db.execute(f"ALTER TABLE {name} RESET (autovacuum_enabled)")


def drain_commits(  # type: ignore[no-untyped-def]
    db, start_worker, worker_db: str, superuser_url: str, concurrency: int, *extra: str
) -> float:
    """Database commits per run for RUNS zero-length echo runs drained by one worker."""
    datname = urlsplit(worker_db).path.lstrip("/")
    runs = [enqueue_echo(db, "x", 0.0) for _ in range(RUNS)]
    flushed(db)
    observer = psycopg.connect(make_conninfo(superuser_url, dbname="postgres"), autocommit=True)
    stack = contextlib.ExitStack()
    poller = Poller(worker_db)
    try:
        with psycopg.connect(make_conninfo(superuser_url, dbname=datname), autocommit=True) as su:
            # Next to nothing left for autovacuum in the window: of the ten catalogs past its
            # thresholds, only pg_statistic (whose rows the ANALYZE rewrote) remains.
            su.execute("VACUUM ANALYZE")
        stack.enter_context(autovacuum_off(db))
        before = settled_commits(observer, datname, others=2)
        worker = start_worker(
            f"batch-c{concurrency}",
            "--concurrency",
            str(concurrency),
            "--poll",
            "60",
            "--reap-interval",
            "3600",
            *extra,
        )
        wait_until(
            lambda: (
                poller.one(
                    "SELECT count(*) FROM runrow.agent_run WHERE status = 'completed' AND id = ANY('{"
                    + ",".join(str(r) for r in runs)
                    + "}'::uuid[])"
                )
                == RUNS
            ),
            120,
            f"{RUNS} runs to complete",
            interval=0.5,
        )
        worker.signal(15)
        assert worker.wait_exit(60) == 0
        print(worker.log().strip().splitlines()[-1])
        poller.close()
        after = settled_commits(observer, datname, others=1)
    finally:
        stack.close()
        observer.close()
    return (after - before - poller.commits) / RUNS


def test_more_slots_cost_fewer_commits_per_run(db, start_worker, worker_db, superuser_url) -> None:
    one = drain_commits(db, start_worker, worker_db, superuser_url, 1)
    ten = drain_commits(db, start_worker, worker_db, superuser_url, 10)
    print(f"commits per run: --concurrency 1 {one:.2f}, --concurrency 10 {ten:.2f}")
    # Ten runs in lockstep share each claim, each write-through flush and their endings: about
    # two transactions per ten runs. Per-run endings alone would cost one commit per run.
    assert ten < 1.0, f"{ten:.2f} commits per run at --concurrency 10 (--concurrency 1: {one:.2f})"
    assert ten * 2 <= one, f"--concurrency 10 costs {ten:.2f} commits per run, 1 costs {one:.2f}"


def test_zero_length_run_costs_a_claim_and_an_ending(db, start_worker, worker_db, superuser_url) -> None:
    """As the chained SQL API: one finish_runs carrying the run's events, with the claim of its
    successor in the same transaction. The echo handler's message_start and message_stop are
    written through without waiting for their commit, so they ride with the ending, and the
    flush of endings claims the runs for the slots it frees; at --concurrency 10 ten runs share
    it. Before: 4 transactions per run at --concurrency 1 (claim, two write-throughs, the
    ending), then 2.05 (claim, ending) before the claim rode the ending; about 0.45, then 0.2-0.35
    at --concurrency 10."""
    # Everything is queued before the worker starts, so its claim loop never waits on a wake:
    # its LISTEN session can live in another database, where its wake-ups are not counted.
    elsewhere = make_conninfo(worker_db, dbname="postgres")
    one = drain_commits(db, start_worker, worker_db, superuser_url, 1, "--listen-url", elsewhere)
    ten = drain_commits(db, start_worker, worker_db, superuser_url, 10, "--listen-url", elsewhere)
    print(f"worker transactions per run: --concurrency 1 {one:.2f}, --concurrency 10 {ten:.2f}")
    # The dozen fixed transactions of a worker's life (boot reaper pass, hub self-test, the
    # last empty claim, the drain) come to about 0.06 per run over RUNS runs.
    assert one <= 1.2, f"{one:.2f} transactions per zero-length run at --concurrency 1 (chained SQL API: 1)"
    # At --concurrency 10 the count also depends on how many runs each claim finds free, which
    # follows the box's load (0.24 quiet, 0.35 in a fresh-clone make test): the bound says the
    # slots share claims and endings (the c1 count above is what proves the ride-along).
    assert ten <= 0.5, f"{ten:.2f} transactions per zero-length run at --concurrency 10 (the SQL API: 0.2)"
