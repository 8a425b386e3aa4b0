"""What every benchmark shares: a private database, the machine, and percentiles.

Each benchmark runs in a database of its own, created and migrated on the server that
DATABASE_URL points to and dropped afterwards, so it never touches real runs and never
claims one. Latencies come from the database clock: the created_at of journal events.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import datetime

import psycopg

from pyworker.db.devdb import temporary_database, throwaway
from pyworker.db.migrate import migrate

__all__ = ["migrate", "temporary_database"]


IN_A_DATABASE = (
    "It runs in a database of its own, created on the server DATABASE_URL points to and dropped "
    "afterwards (it never touches real runs); without a server, run it as `runrow db run -- python "
    "-m bench...` (a throwaway cluster) or through `make bench`."
)
ON_A_CLUSTER = (
    "It starts a PostgreSQL cluster of its own and removes it afterwards (DATABASE_URL is not used); "
    "`make bench` runs it too."
)


def cli(module: str, description: str | None, epilog: str = IN_A_DATABASE) -> argparse.ArgumentParser:
    """The argument parser of `python -m <module>`, saying where the benchmark runs: parsed
    before anything connects, so `--help` and a misspelt option never start a run. Given the
    module's docstring as `description`, its first line is the description."""
    summary = (description or "").strip().split("\n", 1)[0]
    return argparse.ArgumentParser(prog=f"python -m {module}", description=summary, epilog=epilog)


def server_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if not url:
        sys.exit("bench: set DATABASE_URL, or run it as `make bench` (a throwaway cluster)")
    return url


@contextlib.contextmanager
def bench_database(name: str) -> Iterator[str]:
    """A freshly migrated database for one benchmark; dropped afterwards."""
    with temporary_database(server_url(), f"runrow_bench_{name}") as bench_url:
        yield bench_url


@contextlib.contextmanager
def fsync_cluster(full_page_writes: bool = False) -> Iterator[tuple[str, str]]:
    """(owner URL, superuser URL) of a private cluster with fsync and synchronous_commit on,
    for throughput benchmarks whose commits must cost what they cost in production (and
    full_page_writes too, for WAL as a production server writes it)."""
    with throwaway(fsync=True, full_page_writes=full_page_writes) as cluster:
        yield cluster.url, cluster.superuser_url


def run_alone(name: str, bench: Callable[[str], Awaitable[list[str]]]) -> None:
    """One benchmark on its own (`python -m bench.<module>`): its report, then the machine."""
    with bench_database(name) as url:
        for line in [*asyncio.run(bench(url)), machine(url)]:
            print(line)


def machine(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT current_setting('server_version'), current_setting('fsync')").fetchone()
    assert row is not None
    return (
        f"machine: {os.cpu_count()} cpus, {platform.platform()}, Python {platform.python_version()}, "
        f"PostgreSQL {row[0]} (fsync {row[1]})"
    )


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile; enough for a benchmark report."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summary_ms(values: Sequence[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"n={len(ms)} p50={percentile(ms, 50):.1f} ms p99={percentile(ms, 99):.1f} ms "
        f"mean={statistics.fmean(ms):.1f} ms max={max(ms):.1f} ms"
    )


def event_times(conn: psycopg.Connection, run_id: uuid.UUID) -> dict[str, datetime]:
    """created_at of the first event of each type in the run's journal (database clock)."""
    rows = conn.execute(
        "SELECT type, created_at FROM runrow.read_events(run_id => %s, after_seq => 0, max_events => 10000)",
        (run_id,),
    ).fetchall()
    first: dict[str, datetime] = {}
    for kind, at in rows:
        first.setdefault(kind, at)
    return first
