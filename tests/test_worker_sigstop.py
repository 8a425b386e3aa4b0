"""A worker SIGSTOPped past its lease is reaped by another worker's reaper; SIGCONTed, it
learns it lost the run (heartbeat owned = false, or its journal flush fenced out), stands
down and writes nothing more: the journal holds exactly one ending, the reaper's."""

from __future__ import annotations

import signal

from worker_support import (
    db,
    enqueue_echo,
    events,
    start_worker,
    status,
    wait_status,
    wait_streaming,
    worker_db,
)

__all__ = ["db", "start_worker", "worker_db"]


def test_stopped_worker_learns_it_lost_the_run_and_writes_nothing(db, start_worker) -> None:
    a = start_worker(
        "paused-a", "--lease", "1", "--grace", "0", "--concurrency", "1", "--reap-interval", "600"
    )
    run = enqueue_echo(db, "a long answer that will be cut off " * 5, duration=8)
    wait_streaming(db, run)

    a.signal(signal.SIGSTOP)
    start_worker("reaper-b", "--lease", "1", "--grace", "0", "--reap-interval", "0.3", "--poll", "0.5")
    wait_status(db, run, "failed", timeout=20)
    journal_at_reap = events(db, run)
    assert [e["type"] for e in journal_at_reap].count("complete") == 1

    a.signal(signal.SIGCONT)
    a.wait_log("run lost; this worker writes nothing more for it")
    assert a.proc.poll() is None  # the worker itself carries on
    assert status(db, run) == "failed"
    assert events(db, run) == journal_at_reap  # not one row more: no delta, no second ending

    a.signal(signal.SIGTERM)
    assert a.wait_exit(15) == 0
    assert events(db, run) == journal_at_reap
