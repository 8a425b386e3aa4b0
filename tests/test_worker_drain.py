"""SIGTERM with runs in flight: claiming stops at once, runs that fit the drain budget finish,
runs past it are released with error 'drained' (the attempts policy decides: requeued while
attempts are left, else failed), nothing is left running, and the worker exits 0."""

from __future__ import annotations

import json
import signal
import time

from stuck_handler import USAGE
from worker_support import (
    db,
    enqueue_echo,
    events,
    run_row,
    start_worker,
    status,
    streamed_text,
    wait_streaming,
    worker_db,
    worker_with_test_handler,
)

from pyworker.cli.worker_exit import LEFT_RUNS_STATUS

__all__ = ["db", "start_worker", "worker_db"]


def test_sigterm_drains_then_releases_what_is_left(db, start_worker) -> None:
    w = start_worker("drainer", "--concurrency", "4", "--lease", "2", "--drain", "5", "--poll", "0.5")
    short = [enqueue_echo(db, f"short answer {i}", duration=3) for i in range(2)]
    long_once = enqueue_echo(db, "long answer " * 50, duration=60, max_attempts=1)
    long_twice = enqueue_echo(db, "long answer " * 50, duration=60, max_attempts=2)
    for run in [*short, long_once, long_twice]:
        wait_streaming(db, run)
    assert all(status(db, run) == "running" for run in short)  # in flight when the signal lands

    signalled = time.monotonic()
    w.signal(signal.SIGTERM)
    w.wait_log("SIGTERM: draining")
    late = enqueue_echo(db, "enqueued after the signal", duration=0.1)
    assert w.wait_exit(30) == 0
    took = time.monotonic() - signalled

    for run in short:
        assert status(db, run) == "completed"
        assert streamed_text(db, run) == run_row(db, run)["result"]["text"]
    once = run_row(db, long_once)
    assert once["status"] == "failed" and once["error"].startswith("drained")
    twice = run_row(db, long_twice)
    assert twice["status"] == "queued" and twice["attempt"] == 1  # attempts left: back in the queue
    assert run_row(db, late)["status"] == "queued" and run_row(db, late)["attempt"] == 0  # never claimed
    assert db.execute("SELECT count(*) FROM runrow.agent_run WHERE status = 'running'").fetchone() == (0,)
    assert 5 <= took < 15  # waited out the budget for the long runs, then released them promptly


def test_second_signal_exits_at_once(db, start_worker) -> None:
    w = start_worker(
        "impatient", "--concurrency", "1", "--lease", "2", "--drain", "60", "--log-format", "json"
    )
    run = enqueue_echo(db, "long answer " * 50, duration=60)
    wait_streaming(db, run)
    w.signal(signal.SIGTERM)
    w.wait_log("draining")
    signalled = time.monotonic()
    w.signal(signal.SIGINT)
    assert w.wait_exit(10) == 1
    assert time.monotonic() - signalled < 5  # did not wait out the 60 s budget
    assert status(db, run) == "running"  # left to the reaper (lease + grace)
    lines = [json.loads(line) for line in w.log().splitlines() if line.startswith("{")]
    claimed = [r for r in lines if r["msg"].startswith("run claimed")]
    assert claimed and claimed[0]["run_id"] == str(run) and claimed[0]["attempt"] == 1
    assert claimed[0]["conversation_id"] and claimed[0]["worker_id"] == "impatient"


def test_a_run_stuck_past_the_drain_is_cancelled_and_its_cleanup_lands(db, worker_db) -> None:
    """A run that ignores the drain's interrupt is cancelled a lease later, and what it does on
    that cancellation (pay for the response it cut, journal it) must land: the drain cancelled
    such tasks and went on at once to stop the journal writer and close the pools, under the
    cleanup, and neither the event nor the usage was written (the worker audit)."""
    w = worker_with_test_handler(
        worker_db,
        "stuck-drain",
        ["--concurrency", "1", "--lease", "2", "--drain", "0.5", "--poll", "0.3"],
        "stuck_handler:handle",
    )
    try:
        w.wait_started()
        run = enqueue_echo(db, "stuck", max_attempts=2)
        wait_streaming(db, run)
        w.signal(signal.SIGTERM)
        w.wait_log("stuck: the drain's interrupt is ignored")
        assert w.wait_exit(30) == 0, w.log()
        log = w.log()
        assert "PoolClosed" not in log and "is already closed" not in log and "not recorded" not in log, log
        types = [e["type"] for e in events(db, run)]
        assert "interrupted" in types, (types, log)
        spent = db.execute("SELECT spent_tokens FROM runrow.agent_run WHERE id = %s", (run,)).fetchone()
        assert spent == (USAGE["input_tokens"] + USAGE["output_tokens"],), (spent, log)
    finally:
        w.close()


DEAF_LEASE = 30  # the waits after the drain were a lease each: 60 s here, past systemd's 90 s with more


def test_a_run_that_ignores_every_interrupt_does_not_hold_the_shutdown_past_its_bound(
    db, worker_db, tmp_path
) -> None:
    """After the drain budget the worker waited a lease for the abandoned runs, then another
    lease for the ones it cancelled: drain + 2 x lease (60 s past --drain at --lease 30) before
    the writer flush and the webhooks, past Kubernetes' 30 s grace and near systemd's 90 s. The
    waits after the drain now share one budget, max(5, min(lease, 10)) s (README: Drain).
    The process then leaves with os._exit (asyncio.run would wait on the deaf task for ever),
    which skipped the atexit handlers (the tracer provider's flush of its batched spans) and
    exited 0 as after a clean stop: now they run, bounded, and it exits 1 (runs left behind)."""
    ran = tmp_path / "atexit-ran"
    w = worker_with_test_handler(
        worker_db,
        "deaf-drain",
        ["--concurrency", "1", "--lease", str(DEAF_LEASE), "--drain", "0.5", "--poll", "0.3"],
        "deaf_handler:handle",
        env={"DEAF_ATEXIT_FILE": str(ran)},
    )
    try:
        w.wait_started()
        run = enqueue_echo(db, "deaf", max_attempts=2)
        wait_streaming(db, run)
        signalled = time.monotonic()
        w.signal(signal.SIGTERM)
        w.wait_log("deaf: an interrupt is ignored")
        code = w.wait_exit(DEAF_LEASE * 3)
        took = time.monotonic() - signalled
        assert code == LEFT_RUNS_STATUS == 1, (code, w.log())
        assert took < 0.5 + 15, (took, w.log())  # drain + the shared 10 s, with a margin
        assert "did not stop when cancelled" in w.log(), w.log()
        assert "1 run(s) left to the reaper" in w.log(), w.log()
        assert ran.read_text() == "exit handlers ran", w.log()
    finally:
        w.close()
