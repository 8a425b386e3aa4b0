"""Helpers for the agent-loop tests: the fake Messages API, agent worker processes and in-process
workers, enqueueing agent runs, and reading what a run did (steps, tool effects). Run rows, the
journal and waiting on them: worker_support.

Worker processes run `python -m pyworker worker --handler pyworker.agent:handle --tools
pyworker.demo.tools` with ANTHROPIC_BASE_URL pointing at a FakeModel served from this process.
The demo tools work in $RUNROW_DEMO_DIR and record their effects there (pyworker/demo/tools.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from worker_support import WorkerProcess, enqueue_run

from pyworker.agent import loop as agent
from pyworker.db.devdb import temporary_database
from pyworker.fake.scenarios import DEMO_TOOLS
from pyworker.fake.server import FakeModel
from pyworker.worker.process import Worker

AGENT = "pyworker.agent:handle"
TOOLS = "pyworker.demo.tools"
DEMO_TASK = "Send the weekly status email and write report.md."
DEMO_SYSTEM = "You are a careful assistant. Use the tools."
THINKING = {"max_tokens": 4096, "thinking": {"type": "enabled", "budget_tokens": 1024}}


def enqueue_agent(
    conn: psycopg.Connection,
    content: Any = DEMO_TASK,
    *,
    conversation_id: uuid.UUID | None = None,
    model: str = "claude-fake-1",
    system: str | None = DEMO_SYSTEM,
    tools: Any = DEMO_TOOLS,
    metadata: dict[str, Any] | None = None,
    max_attempts: int = 3,
) -> uuid.UUID:
    return enqueue_run(
        conn,
        content,
        model,
        conversation_id=conversation_id,
        max_attempts=max_attempts,
        system_prompt=system,
        tools=list(tools),
        metadata=THINKING if metadata is None else metadata,
    )


def steps(conn: psycopg.Connection, run_id: uuid.UUID) -> list[tuple[int, str, str]]:
    """(seq, kind, payload text) of the run's step log."""
    return [
        (seq, kind, text)
        for seq, kind, text in conn.execute(
            "SELECT seq, kind, payload::text FROM runrow.agent_step WHERE run_id = %s ORDER BY seq", (run_id,)
        ).fetchall()
    ]


def effect_keys(conn: psycopg.Connection, run_id: uuid.UUID) -> dict[str, str]:
    """idempotency key -> tool, of every tool call the run began."""
    return dict(
        conn.execute(
            "SELECT idempotency_key, tool FROM runrow.tool_effect WHERE run_id = %s", (run_id,)
        ).fetchall()
    )


def transcript(conn: psycopg.Connection, run_id: uuid.UUID) -> list[tuple[str, Any]]:
    """The run's steps with what varies between runs (ids, signatures) masked: what happened."""
    out: list[tuple[str, Any]] = []
    for _, kind, text in steps(conn, run_id):
        payload = json.loads(text)
        if kind == "model_turn":
            out.append(
                (
                    kind,
                    [{k: v for k, v in b.items() if k not in ("id", "signature", "data")} for b in payload],
                )
            )
        else:
            content = payload.get("content")
            with contextlib.suppress(TypeError, ValueError):
                content = json.loads(content)
            if isinstance(content, dict):
                content = {k: v for k, v in content.items() if k != "message_id"}
            out.append((kind, {"content": content, "is_error": payload.get("is_error")}))
    return out


def undecorated(value: Any) -> Any:
    """A request (or a part of one) without the prompt-cache breakpoints the loop adds
    (pyworker/agent/prompt_cache.py): every `cache_control` dropped, and a system prompt or
    message content the marker turned into one text block a string again. What is left is what
    the step log and the pinned prompt hold, byte for byte."""
    if isinstance(value, list):
        return [undecorated(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: undecorated(v) for k, v in value.items() if k != "cache_control"}
    # Only a system prompt and a user message's content are ever strings the loop turned into a block.
    for key in ("system",) if "system" in out else ("content",) if out.get("role") == "user" else ():
        blocks = out.get(key)
        if isinstance(blocks, list) and len(blocks) == 1 and isinstance(blocks[0], dict):
            if set(blocks[0]) == {"type", "text"} and blocks[0]["type"] == "text":
                out[key] = blocks[0]["text"]
    return out


def agent_env(base_url: str, demo_dir: Path, tool_delay: str = "0") -> dict[str, str]:
    """An agent worker's environment: the Messages API at base_url, the demo tools in demo_dir."""
    return {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "test-key",
        "RUNROW_DEMO_DIR": str(demo_dir),
        "RUNROW_DEMO_TOOL_DELAY": tool_delay,
    }


# Forked workers that take over a lapsed run fast: 1 s leases, reaped without grace.
QUICK_TAKEOVER: dict[str, Any] = {
    "lease_seconds": 1,
    "grace_seconds": 0,
    "reap_interval": 0.2,
    "poll_seconds": 0.3,
    "concurrency": 1,
}


def agent_worker(
    url: str, name: str, base_url: str, demo_dir: Path, *args: str, tool_delay: str = "0"
) -> WorkerProcess:
    """A `runrow worker` process running the agent loop with the demo tools."""
    env = agent_env(base_url, demo_dir, tool_delay)
    return WorkerProcess(url, name, ["--tools", TOOLS, *args], handler=AGENT, env=env)


class InProcessWorker:
    """A Worker on its own event loop in a thread: fast to start, for tests that need no SIGKILL."""

    def __init__(self, url: str, name: str = "inproc", **kwargs: Any) -> None:
        options: dict[str, Any] = {
            "lease_seconds": 2,
            "poll_seconds": 0.5,
            "grace_seconds": 1,
            "reap_interval": 0.5,
            "concurrency": 2,
            "drain_seconds": 5,
            "handler": agent.handle,
        }
        options.update(kwargs)
        self.worker = Worker(url, worker_id=name, **options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.error: BaseException | None = None

    def _main(self) -> None:
        async def go() -> None:
            self._loop = asyncio.get_running_loop()
            self._started.set()
            await self.worker.run(install_signals=False)

        try:
            asyncio.run(go())
        except BaseException as exc:
            self.error = exc
            self._started.set()

    def start(self) -> InProcessWorker:
        self._thread.start()
        self._started.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.worker.request_stop)
        self._thread.join(20)

    def __enter__(self) -> InProcessWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _forked_main(url: str, name: str, env: dict[str, str], options: dict[str, Any]) -> None:
    os.environ.update(env)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(name)s %(message)s")
    code = 1
    try:
        options.setdefault("config", {"tools_module": TOOLS})
        code = asyncio.run(Worker(url, worker_id=name, handler=agent.handle, **options).run())
    finally:
        os._exit(code)  # never run the parent's atexit/finalizers (its connections are not ours)


class ForkedWorker:
    """A worker in a forked child process: a real process to SIGKILL, without the seconds of
    interpreter start-up and imports a fresh `runrow worker` costs (the modules are loaded)."""

    def __init__(self, url: str, name: str, env: dict[str, str], **options: Any) -> None:
        self.name = name
        context = multiprocessing.get_context("fork")
        self.proc = context.Process(target=_forked_main, args=(url, name, env, options), daemon=True)
        self.proc.start()

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def kill(self) -> None:
        if self.proc.is_alive():
            os.kill(self.pid, signal.SIGKILL)
        self.proc.join(10)

    def stop(self) -> None:
        if self.proc.is_alive():
            os.kill(self.pid, signal.SIGTERM)
            self.proc.join(15)
        self.kill()


@contextlib.contextmanager
def in_process_worker(url: str, name: str = "inproc", **kwargs: Any) -> Iterator[InProcessWorker]:
    worker = InProcessWorker(url, name, **kwargs).start()
    try:
        yield worker
    finally:
        worker.stop()


def fake_api_worker(
    url: str, fake: FakeModel, name: str, config: dict[str, Any] | None = None, **options: Any
) -> InProcessWorker:
    """An in-process agent worker (not started: enter it) against the fake Messages API `fake`:
    its URL, the key "test-key" and no SDK retries, so that each error the fake sends reaches the
    agent loop as sent, not the SDK's own backoff. `config` goes on top (limits such as
    rate_limit_max_wait, a tool registry), `options` to the Worker (lease_seconds, ...)."""
    settings = {
        "anthropic_base_url": fake.base_url,
        "anthropic_api_key": "test-key",
        "anthropic_max_retries": 0,
        **(config or {}),
    }
    return InProcessWorker(url, name, config=settings, **options)


@contextlib.contextmanager
def one_slot_agent_worker(url: str, name: str, rate_limit_max_wait: float) -> Iterator[FakeModel]:
    """A fresh fake Messages API ("text") and a started one-slot agent worker against it (5 s
    lease, no SDK retries, waiting in place for a limit at most rate_limit_max_wait seconds), for a
    test that shapes the queue and the limits first. Yields the fake: what the worker sent."""
    with (
        FakeModel("text") as fake,
        fake_api_worker(
            url, fake, name, {"rate_limit_max_wait": rate_limit_max_wait}, lease_seconds=5, concurrency=1
        ),
    ):
        yield fake


@pytest.fixture(scope="module")
def module_db(database_url: str) -> Iterator[str]:
    """A freshly migrated database shared by one test module's tests."""
    with temporary_database(database_url, "runrow_agent") as url:
        yield url


@pytest.fixture(scope="module")
def module_conn(module_db: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(module_db, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModel]:
    """The fake Messages API (scenario "text") shared by one test module's tests, for a module
    whose worker fixture runs against it (fake_api_worker); its tests reset or inject into it."""
    with FakeModel("text") as server:
        yield server
