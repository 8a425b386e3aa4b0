"""A saturated worker (every slot busy) claims nothing, even when woken by enqueues; a second
worker with free slots takes the queue. The slot is acquired before the claim."""

from __future__ import annotations

from worker_support import (
    db,
    enqueue_echo,
    run_row,
    start_worker,
    status,
    wait_status,
    wait_streaming,
    worker_db,
)

__all__ = ["db", "start_worker", "worker_db"]


def claims_by(db, worker: str) -> int:  # type: ignore[no-untyped-def]
    return db.execute(
        "SELECT count(*) FROM runrow.run_event WHERE type = 'run_claimed' AND payload->>'worker_id' = %s",
        (worker,),
    ).fetchone()[0]


def test_saturated_worker_claims_nothing_while_a_free_one_takes_the_queue(db, start_worker) -> None:
    busy = start_worker("busy", "--concurrency", "1", "--lease", "2", "--poll", "0.3")
    long_run = enqueue_echo(db, "a long answer " * 40, duration=30)
    wait_streaming(db, long_run)

    queued = [enqueue_echo(db, f"short {i}", duration=0.2) for i in range(3)]  # each one wakes `busy`
    busy.wait_log("run claimed")
    start_worker("free", "--concurrency", "3", "--lease", "2", "--poll", "0.3")
    for run in queued:
        wait_status(db, run, "completed")
        assert run_row(db, run)["worker_id"] == "free"
    assert claims_by(db, "busy") == 1  # only the long run, though it was woken three times
    assert status(db, long_run) == "running"
    assert run_row(db, long_run)["worker_id"] == "busy"
