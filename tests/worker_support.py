"""Helpers for worker tests: a private migrated database per test, worker subprocesses
(`python -m pyworker worker --handler pyworker.worker.echo:handle ...`), echo runs, and
waiting on rows (the truth) with a deadline."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from pyworker.db.cancel_safe_pool import CancelSafePool
from pyworker.db.devdb import database_url_for, temporary_database
from pyworker.db.hub import Hub
from pyworker.worker.dispatcher import Dispatcher
from pyworker.worker.handler import RunHandler
from pyworker.worker.journal import JournalWriter

REPO = Path(__file__).resolve().parent.parent
ECHO = "pyworker.worker.echo:handle"
T = TypeVar("T")


@pytest.fixture
def worker_db(database_url: str) -> Iterator[str]:
    """A freshly migrated database of this test's own (no other test's runs to claim)."""
    with temporary_database(database_url, "runrow_worker") as url:
        yield url


@pytest.fixture
def worker_db_superuser(worker_db: str, superuser_url: str) -> str:
    """The test's database as the cluster's superuser, for set-ups no role may write."""
    return database_url_for(superuser_url, urlsplit(worker_db).path.lstrip("/"))


@pytest.fixture
def db(worker_db: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(worker_db, autocommit=True) as conn:
        yield conn


@pytest.fixture
async def pool(worker_db: str) -> AsyncIterator[AsyncConnectionPool]:
    """An open autocommit pool on this test's database, for in-process workers' parts."""
    p = CancelSafePool(worker_db, min_size=1, max_size=6, kwargs={"autocommit": True}, open=False)
    await p.open()
    yield p
    await p.close()


class WorkerProcess:
    """A `python -m pyworker worker` process (the echo handler unless told), its output in a log file."""

    def __init__(
        self,
        url: str,
        name: str,
        args: list[str],
        *,
        handler: str = ECHO,
        env: dict[str, str] | None = None,
        prefix: list[str] | None = None,
    ) -> None:
        self.name = name
        self.log_path = Path(tempfile.mkstemp(prefix=f"runrow-{name}-", suffix=".log")[1])
        self._log = self.log_path.open("wb")
        # prefix: a wrapper such as `ip netns exec NS` or `faketime +2h` that execs the worker.
        cmd = [
            *(prefix or []),
            *(sys.executable, "-m", "pyworker", "worker", "--handler", handler, "--worker-id", name, *args),
        ]
        environment = {**os.environ, "DATABASE_URL": url, **(env or {})}
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, env=environment, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, needle: str, timeout: float = 15) -> None:
        wait_until(lambda: needle in self.log(), timeout, f"{self.name} to log {needle!r}\n{self.log()}")

    def wait_started(self, timeout: float = 15) -> WorkerProcess:
        self.wait_log(f"worker {self.name} started", timeout)
        return self

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def wait_exit(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL: no drain, no release, no last write."""
        self.proc.kill()
        self.proc.wait(timeout=10)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


def worker_with_test_handler(
    url: str, name: str, args: list[str], handler: str, env: dict[str, str] | None = None
) -> WorkerProcess:
    """A worker process whose handler is a module of tests/ (e.g. "hold_handler:handle")."""
    path = os.pathsep.join(p for p in (str(REPO / "tests"), os.environ.get("PYTHONPATH")) if p)
    return WorkerProcess(url, name, args, handler=handler, env={**(env or {}), "PYTHONPATH": path})


@pytest.fixture
def start_worker(worker_db: str) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def _start(name: str, *args: str, ready: bool = True) -> WorkerProcess:
        w = WorkerProcess(worker_db, name, list(args))
        started.append(w)
        if ready:
            w.wait_started()
        return w

    yield _start
    for w in started:
        w.close()


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll rows (the truth) until `predicate` is truthy; fail naming what we waited for."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def wait_until_async(predicate: Callable[[], object], within: float = 10, what: str = "it") -> None:
    """wait_until for a test on the event loop its workers run on: sleeps without blocking it."""
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {within}s waiting for {what}"
        await asyncio.sleep(0.02)


def enqueue_run(
    conn: psycopg.Connection,
    content: Any,
    model: str,
    *,
    conversation_id: uuid.UUID | None = None,
    max_attempts: int = 1,
    system_prompt: str | None = None,
    tools: list[Any] | None = None,
    metadata: dict[str, Any] | None = None,
    user_id: str | None = None,
    rate_limit_key: str | None = None,
) -> uuid.UUID:
    """runrow.enqueue_run by name (a new conversation unless given); None keeps its default."""
    args: dict[str, Any] = {
        "conversation_id": conversation_id or uuid.uuid4(),
        "content": Jsonb(content),
        "model": model,
        "max_attempts": max_attempts,
        "system_prompt": system_prompt,
        "tools": None if tools is None else Jsonb(tools),
        "metadata": None if metadata is None else Jsonb(metadata),
        "user_id": user_id,
        "rate_limit_key": rate_limit_key,
    }
    given = {name: value for name, value in args.items() if value is not None}
    named = ", ".join(f"{name} => %({name})s" for name in given)
    row = conn.execute(f"SELECT run_id FROM runrow.enqueue_run({named})", given).fetchone()
    assert row is not None
    return row[0]


def enqueue_echo(
    conn: psycopg.Connection,
    text: str = "hello from echo",
    duration: float = 0.5,
    *,
    conversation_id: uuid.UUID | None = None,
    max_attempts: int = 1,
    **meta: Any,
) -> uuid.UUID:
    metadata = {"echo": text, "duration": duration, **meta}
    return enqueue_run(
        conn, text, "echo", conversation_id=conversation_id, max_attempts=max_attempts, metadata=metadata
    )


def run_row(conn: psycopg.Connection, run_id: uuid.UUID) -> dict[str, Any]:
    cur = conn.execute(
        "SELECT id, status, attempt, max_attempts, worker_id, error, result, claim_expires_at, "
        "finished_at, cancel_requested FROM runrow.agent_run WHERE id = %s",
        (run_id,),
    )
    row = cur.fetchone()
    assert row is not None
    return dict(zip([d.name for d in cur.description or ()], row, strict=True))


def status(conn: psycopg.Connection, run_id: uuid.UUID) -> str:
    return str(run_row(conn, run_id)["status"])


def events(conn: psycopg.Connection, run_id: uuid.UUID) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT seq, payload FROM runrow.run_event WHERE run_id = %s ORDER BY seq", (run_id,)
    ).fetchall()
    return [{"seq": seq, **payload} for seq, payload in rows]


def streamed_text(conn: psycopg.Connection, run_id: uuid.UUID) -> str:
    return "".join(e.get("text", "") for e in events(conn, run_id) if e["type"] == "text_delta")


def wait_status(
    conn: psycopg.Connection, run_id: uuid.UUID, wanted: set[str] | str, timeout: float = 15
) -> str:
    wanted = {wanted} if isinstance(wanted, str) else wanted
    return wait_until(
        lambda: (s := status(conn, run_id)) in wanted and s, timeout, f"run {run_id} to be {sorted(wanted)}"
    )


def wait_streaming(conn: psycopg.Connection, run_id: uuid.UUID, timeout: float = 15) -> None:
    """Running and at least one delta committed: the run is genuinely mid-way."""
    wait_until(
        lambda: status(conn, run_id) == "running" and streamed_text(conn, run_id),
        timeout,
        f"run {run_id} to be streaming",
    )


def in_process_dispatcher(
    pool: AsyncConnectionPool,
    writer: JournalWriter,
    handler: RunHandler,
    worker_id: str,
    *,
    concurrency: int,
    lease_seconds: int,
    hub: Hub | None = None,
    poll_seconds: float = 0.2,
) -> Dispatcher:
    """A dispatcher in the test's own event loop (not started): what `runrow worker` builds."""
    return Dispatcher(
        pool=pool,
        hub=hub,
        writer=writer,
        handler=handler,
        concurrency=concurrency,
        lease_seconds=lease_seconds,
        poll_seconds=poll_seconds,
        worker_id=worker_id,
    )
