"""A worker SIGSTOPped past its lease is reaped by another worker's reaper; SIGCONTed, it
learns it lost the run (heartbeat owned = false, or its journal flush fenced out), stands
down and writes nothing more: the journal holds exactly one ending, the reaper's.

Frozen inside its journal flush transaction (the RUNROW_TEST_FLUSH_PAUSE hook holds it open
before COMMIT), it holds its runs' row locks: the fleet's reapers skip that run and reap the
others, a stop gives up within its lock_timeout, and PostgreSQL ends the frozen session after
the worker's idle_in_transaction_session_timeout so another worker can take the run."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from worker_support import (
    WorkerProcess,
    db,
    enqueue_echo,
    events,
    run_row,
    start_worker,
    status,
    streamed_text,
    wait_status,
    wait_streaming,
    wait_until,
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


# --- frozen INSIDE a transaction: mid-flush, holding its runs' row locks -------------------

PAUSE = {"RUNROW_TEST_FLUSH_PAUSE": "5"}  # the journal writer's test hook: wait before COMMIT
PAUSED = "test hook: flush transaction paused"


@pytest.fixture
def spawn(worker_db: str) -> Iterator[Callable[..., WorkerProcess]]:
    """start_worker with a URL and environment of the test's choosing."""
    started: list[WorkerProcess] = []

    def _spawn(
        name: str, *args: str, url: str | None = None, env: dict[str, str] | None = None
    ) -> WorkerProcess:
        w = WorkerProcess(url or worker_db, name, list(args), env=env)
        started.append(w)
        return w.wait_started()

    yield _spawn
    for w in started:
        w.close()


def frozen_flushes(db: psycopg.Connection) -> list[int]:
    """Backends of worker sessions sitting idle inside a transaction: a paused flush."""
    rows = db.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'runrow-worker' AND state = 'idle in transaction'"
    ).fetchall()
    return [pid for (pid,) in rows]


def freeze_mid_flush(db: psycopg.Connection, worker: WorkerProcess) -> int:
    worker.wait_log(PAUSED)
    worker.signal(signal.SIGSTOP)
    frozen = frozen_flushes(db)
    assert len(frozen) == 1, f"expected one flush transaction held open, got {frozen}"
    return frozen[0]


def conversation_rows(db: psycopg.Connection, conversation: uuid.UUID) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT r.id, r.status, r.cancel_requested, r.claim_token, r.updated_at,"
        "       (SELECT count(*) FROM runrow.run_event AS e WHERE e.run_id = r.id)"
        " FROM runrow.agent_run AS r WHERE r.conversation_id = %s ORDER BY r.enqueue_seq",
        (conversation,),
    ).fetchall()


def test_a_worker_frozen_mid_flush_stalls_neither_the_reapers_nor_a_stop(
    db: psycopg.Connection, worker_db: str, spawn: Callable[..., WorkerProcess]
) -> None:
    # Its idle-in-transaction limit switched off through the URL (a deployment's own options
    # win over the derived ones), so the frozen flush keeps its locks as long as this test needs.
    url = f"{worker_db}&options={quote('-c idle_in_transaction_session_timeout=0')}"
    a = spawn("frozen-a", "--lease", "2", "--concurrency", "1", "--reap-interval", "600", url=url, env=PAUSE)
    conversation = uuid.uuid4()
    run = enqueue_echo(db, "never streamed", duration=2, conversation_id=conversation, max_attempts=2)
    next_turn = enqueue_echo(db, "the next turn", conversation_id=conversation)
    freeze_mid_flush(db, a)

    # Another run whose worker died: claimed here and never beaten. Its lease is made to lapse
    # after the frozen run's, so a reaper that waited on the frozen row would never reach it.
    orphan = enqueue_echo(db, "orphan")
    assert db.execute("SELECT run_id FROM runrow.claim_runs('gone', 1, 3600)").fetchone() == (orphan,)
    wait_until(
        lambda: run_row(db, run)["claim_expires_at"] < db.execute("SELECT now()").fetchone()[0],
        15,
        "the frozen run's lease to lapse",
    )
    db.execute("UPDATE runrow.agent_run SET claim_expires_at = now() WHERE id = %s", (orphan,))
    before = conversation_rows(db, conversation)

    # (1) Another worker's reaper reaps the orphan, skipping the frozen run on every pass.
    spawn("reaper-b", "--grace", "0", "--reap-interval", "0.3")
    wait_status(db, orphan, "failed", timeout=20)
    assert run_row(db, run)["status"] == "running"

    # (2) A stop answers within its lock_timeout, names the run, and writes nothing. (The
    # statement_timeout only keeps a regression from hanging the suite.)
    with (
        psycopg.connect(worker_db, autocommit=True, options="-c statement_timeout=30s") as client,
        pytest.raises(psycopg.errors.LockNotAvailable) as stopped,
    ):
        client.execute("SELECT * FROM runrow.stop_conversation(%s)", (conversation,))
    assert str(run) in (stopped.value.diag.message_primary or "")
    assert conversation_rows(db, conversation) == before
    assert status(db, next_turn) == "queued"


def test_the_server_ends_a_frozen_flush_and_another_worker_finishes_the_run(
    db: psycopg.Connection, spawn: Callable[..., WorkerProcess]
) -> None:
    a = spawn("frozen-a", "--lease", "3", "--concurrency", "1", "--reap-interval", "600", env=PAUSE)
    run = enqueue_echo(db, "answered by another worker", duration=1, max_attempts=2)
    frozen = freeze_mid_flush(db, a)
    spawn("reaper-b", "--grace", "0", "--reap-interval", "0.3")

    # (3) The worker's own idle_in_transaction_session_timeout (its lease): PostgreSQL ends the
    # frozen session, its transaction rolls back, the row lock is free; after the lease the
    # reaper requeues the run and the other worker runs it to the end.
    wait_until(
        lambda: (
            frozen not in frozen_flushes(db)
            and db.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (frozen,)).fetchone()
            == (0,)
        ),
        30,
        f"the server to end the frozen flush (backend {frozen})",
    )
    wait_status(db, run, "completed", timeout=30)
    row = run_row(db, run)
    assert (row["worker_id"], row["attempt"]) == ("reaper-b", 2)
    journal = events(db, run)
    kinds = [e["type"] for e in journal]
    # Nothing of the frozen batch landed: the first attempt journaled only its claim.
    assert kinds[:5] == ["user_message_created", "run_queued", "run_claimed", "run_requeued", "run_claimed"]
    assert kinds.count("complete") == 1 and kinds[-1] == "complete"
    assert streamed_text(db, run) == "answered by another worker"

    a.signal(signal.SIGCONT)
    wait_until(
        lambda: any(note in a.log() for note in ("fenced out", "run lost", "no longer ours")),
        20,
        f"frozen-a to learn it lost the run\n{a.log()}",
    )
    assert events(db, run) == journal
    a.signal(signal.SIGTERM)
    assert a.wait_exit(15) == 0
    assert events(db, run) == journal
