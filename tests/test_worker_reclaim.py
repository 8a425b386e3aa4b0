"""A worker paused past its lease (SIGSTOP), its run reaped and requeued meanwhile, resumed
(SIGCONT) and re-claiming that same run while its stale attempt is still standing down: the
stale attempt's cleanup must not touch the new one. The new attempt's journal holds its whole
answer, and the worker still counts the new attempt as in flight (a drain waits for it)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import psycopg
import pytest
from worker_support import (
    WorkerProcess,
    db,
    enqueue_echo,
    events,
    run_row,
    wait_status,
    wait_streaming,
    wait_until,
    worker_db,
    worker_with_test_handler,
)

__all__ = ["db", "worker_db"]

ANSWER = "every word of this answer must reach the journal of the attempt that finishes " * 2


@pytest.fixture
def worker(worker_db: str) -> Iterator[WorkerProcess]:
    w = worker_with_test_handler(
        worker_db,
        "reclaimer",
        # Two slots: the re-claim needs one while the stale attempt still holds the other.
        # No reaper of its own after boot: the test reaps while the worker is stopped.
        ["--concurrency", "2", "--lease", "2", "--grace", "0", "--reap-interval", "600", "--poll", "0.5"],
        "reclaim_handler:handle",
    )
    try:
        w.wait_started()
        yield w
    finally:
        w.close()


def reap(db: psycopg.Connection) -> list[tuple[object, str]]:
    return db.execute("SELECT run_id, outcome FROM runrow.reap_expired_runs(grace_seconds => 0)").fetchall()


def final_attempt_text(db: psycopg.Connection, run) -> str:  # type: ignore[no-untyped-def]
    journal = events(db, run)
    last_claim = max(i for i, e in enumerate(journal) if e["type"] == "run_claimed")
    return "".join(e.get("text", "") for e in journal[last_claim:] if e["type"] == "text_delta")


def reclaimed_while_standing_down(db: psycopg.Connection, worker: WorkerProcess):  # type: ignore[no-untyped-def]
    """Pause the worker mid-stream, reap its run, resume it: the same process claims the run
    again (attempt 2) while attempt 1 is still standing down, then attempt 1 lets go."""
    run = enqueue_echo(db, ANSWER, duration=6, max_attempts=2)
    wait_streaming(db, run)
    worker.signal(signal.SIGSTOP)
    wait_until(lambda: reap(db), 15, "the paused worker's lease to lapse and the run to be reaped")
    assert run_row(db, run)["status"] == "queued"

    worker.signal(signal.SIGCONT)
    worker.wait_log("reclaim handler: the next attempt is journaling; letting go")
    worker.wait_log("run lost; this worker writes nothing more for it")
    row = run_row(db, run)
    assert (row["status"], row["attempt"], row["worker_id"]) == ("running", 2, "reclaimer")
    return run


def assert_answer_journaled_once(db: psycopg.Connection, run) -> None:  # type: ignore[no-untyped-def]
    row = run_row(db, run)
    assert row["status"] == "completed" and row["result"]["text"] == ANSWER
    assert final_attempt_text(db, run) == ANSWER  # what tail and SSE viewers show
    journal = events(db, run)
    assert [e["type"] for e in journal].count("complete") == 1
    assert db.execute("SELECT count(*) FROM runrow.audit() WHERE run_id = %s", (run,)).fetchone() == (0,)


def test_reclaimed_run_journals_the_new_attempts_whole_answer(db, worker) -> None:
    run = reclaimed_while_standing_down(db, worker)
    wait_status(db, run, "completed", timeout=20)
    assert_answer_journaled_once(db, run)


def test_drain_waits_for_the_new_attempt_of_a_reclaimed_run(db, worker) -> None:
    run = reclaimed_while_standing_down(db, worker)
    worker.signal(signal.SIGTERM)  # the drain waits for the runs in flight: attempt 2 is one
    assert worker.wait_exit(30) == 0
    assert_answer_journaled_once(db, run)
