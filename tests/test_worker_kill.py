"""A worker SIGKILLed mid-run: its run is reaped after lease + grace by another worker's
reaper, and the conversation's next turn (held back by one-turn-at-a-time) then runs."""

from __future__ import annotations

import signal
import uuid
from datetime import timedelta

from worker_support import (
    db,
    enqueue_echo,
    events,
    run_row,
    start_worker,
    status,
    streamed_text,
    wait_status,
    wait_streaming,
    worker_db,
)

__all__ = ["db", "start_worker", "worker_db"]


def test_killed_worker_run_is_reaped_then_next_turn_runs(db, start_worker) -> None:
    conv = uuid.uuid4()
    a = start_worker("killed-a", "--lease", "1", "--grace", "1", "--concurrency", "1", "--poll", "0.5")
    first = enqueue_echo(db, "first turn " * 20, duration=30, conversation_id=conv)
    second = enqueue_echo(db, "second turn", duration=0.2, conversation_id=conv)
    wait_streaming(db, first)
    assert status(db, second) == "queued"  # one turn at a time: it waits behind the first

    a.signal(signal.SIGKILL)
    assert a.wait_exit(10) == -signal.SIGKILL
    expires = run_row(db, first)["claim_expires_at"]  # final: nobody heartbeats it any more
    assert status(db, first) == "running"

    start_worker("rescuer-b", "--lease", "1", "--grace", "1", "--reap-interval", "0.3", "--poll", "0.5")
    wait_status(db, first, "failed", timeout=20)  # max_attempts = 1: at-most-once, reaped as failed
    row = run_row(db, first)
    assert row["finished_at"] >= expires + timedelta(seconds=1)  # not before lease + grace
    endings = [e for e in events(db, first) if e["type"] == "complete"]
    assert len(endings) == 1 and endings[0]["status"] == "failed"

    wait_status(db, second, "completed", timeout=20)
    assert run_row(db, second)["worker_id"] == "rescuer-b"
    assert streamed_text(db, second) == "second turn"
