"""A worker whose clock is two hours off (libfaketime, Debian's `faketime`) is still a correct
worker: leases, expiry and reaping come from the database clock alone, so with 2 s leases it
heartbeats, is never reaped while alive (neither by its own reaper nor by a correct worker's),
and its runs complete on their first attempt.

The skewed worker gets libfaketime the way `faketime -f '+2h' runrow worker` gives it (LD_PRELOAD
and FAKETIME in its environment), without the `faketime` wrapper process in between, so the test
signals the worker itself. Its log lines carry its own (skewed) time: the test checks the skew
really took.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from worker_support import WorkerProcess, db, enqueue_echo, events, run_row, status, wait_until, worker_db

__all__ = ["db", "worker_db"]

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
LEASE = 2
GRACE = 1  # a margin for a heartbeat late on a loaded 2-core box; still a reap 3 s after the last one


@pytest.fixture
def spawn(worker_db: str) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def _spawn(name: str, *args: str, skew: str | None = None) -> WorkerProcess:
        env = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": skew, "TZ": "UTC"} if skew else {"TZ": "UTC"}
        w = WorkerProcess(worker_db, name, list(args), env=env)
        started.append(w)
        return w.wait_started()

    yield _spawn
    for w in started:
        w.close()


def logged_clock(worker: WorkerProcess) -> datetime:
    """The worker's own idea of the time, from the asctime of its first log line."""
    match = re.search(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", worker.log(), re.MULTILINE)
    assert match, worker.log()
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)


@pytest.mark.parametrize("skew", ["+2h", "-2h"])
def test_a_worker_two_hours_off_heartbeats_is_never_reaped_and_completes(
    db: psycopg.Connection, spawn: Callable[..., WorkerProcess], skew: str
) -> None:
    if not LIBFAKETIME.exists() or shutil.which("faketime") is None:
        pytest.skip("libfaketime missing: `apt-get install faketime` (make bootstrap installs it)")
    flags = (
        "--lease",
        str(LEASE),
        "--grace",
        str(GRACE),
        "--reap-interval",
        "0.3",
        "--poll",
        "0.5",
        "--concurrency",
        "2",
    )
    skewed = spawn("skewed", *flags, skew=skew)
    db_now = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    offset = logged_clock(skewed) - db_now
    expected = timedelta(hours=2 if skew.startswith("+") else -2)
    assert abs(offset - expected) < timedelta(minutes=2), (
        f"the skew did not take: worker clock off by {offset}"
    )

    # Runs that last several leases: only heartbeats keep them.
    runs = [enqueue_echo(db, f"skewed answer {i} " * 4, duration=3 * LEASE) for i in range(2)]
    wait_until(lambda: all(status(db, r) == "running" for r in runs), 15, "the skewed worker to claim both")
    # A correct worker beside it, with a reaper every 0.3 s: one lapsed lease (+ 1 s) and it reaps.
    spawn("correct", *flags)
    later = [enqueue_echo(db, f"correct answer {i}", duration=LEASE) for i in range(2)]

    # Every lease the skewed worker holds was set by the database clock: never more than one
    # lease ahead of the database's now (a lease from the worker's clock would be 2 h off either
    # way; a beat late under load may leave it a little behind).
    deadline = time.monotonic() + 3 * LEASE
    while time.monotonic() < deadline:
        for (left,) in db.execute(
            "SELECT claim_expires_at - now() FROM runrow.agent_run"
            " WHERE worker_id = 'skewed' AND status = 'running'"
        ).fetchall():
            assert timedelta(seconds=-30) < left <= timedelta(seconds=LEASE + 0.5), f"lease {left} left"
        time.sleep(0.1)

    wait_until(lambda: all(status(db, r) == "completed" for r in runs + later), 30, "every run to complete")
    for r in runs:
        row = run_row(db, r)
        assert (row["worker_id"], row["attempt"]) == ("skewed", 1)
    for r in runs + later:
        kinds = [e["type"] for e in events(db, r)]
        assert "run_requeued" not in kinds and kinds.count("run_claimed") == 1, kinds
    assert db.execute("SELECT * FROM runrow.audit()").fetchall() == []
