"""The contract between the run supervisor and the code that does a run's work."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from pyworker.db.api import ClaimedRun
from pyworker.db.retry import Retry
from pyworker.worker.journal import RunJournal

OutcomeStatus = Literal["completed", "failed", "cancelled", "release", "defer", "parked", "ended"]
T = TypeVar("T")


@dataclass
class RunContext:
    """What a handler gets. Watch `cancel` (stop requested: stop generating, return
    Outcome('cancelled'), the partial text already journaled stays) and never outlive `lost`
    (the supervisor cancels the handler task when the claim is lost). Make database calls
    through `db` (or `retry`): a restart or failover then costs the run nothing."""

    run: ClaimedRun
    pool: AsyncConnectionPool
    journal: RunJournal
    cancel: asyncio.Event
    lost: asyncio.Event
    log: logging.LoggerAdapter  # type: ignore[type-arg]
    worker_id: str
    config: dict[str, Any] = field(default_factory=dict)  # worker flags for handlers, e.g. tools_module
    retry: Retry | None = None  # the run's retry policy (pyworker/db/retry.py); the supervisor sets it

    def __post_init__(self) -> None:
        if self.retry is None:
            self.retry = Retry(30.0, self.log)

    async def db(self, fn: Callable[[AsyncConnection[Any]], Awaitable[T]], what: str) -> T:
        """`fn(conn)` on a pool connection, made again on a fresh one through a transient
        database error; DatabaseUnavailable after about a lease without a database (let it
        propagate: the supervisor then gives the run up quietly). For reads, and for writes the
        SQL makes safe to repeat (heartbeat, begin_tool_call, complete_tool_call); a write that
        would append twice (append_step, append_events) needs `retry.transaction` and a read-back.
        A structural event emitted with wait=False is committed first: the call may journal,
        park or end the run, and the journal keeps its order."""
        assert self.retry is not None
        if self.journal.writing_through:
            await self.journal.flush()
        return await self.retry.call(self.pool, fn, what)


@dataclass(frozen=True)
class Outcome:
    """completed/failed/cancelled: finish_run with that status. release: release_run (the
    attempts policy requeues or fails it). defer: defer_run (a fleet limit's wait, `retry_in`
    required: requeued with the attempt given back, so waiting never fails a run on its last
    attempt). parked: the handler already handed the run back in SQL (e.g. waiting on an
    approval); the supervisor writes nothing. ended: the SQL already ended the run
    (acquire_model_call's budget_exhausted); nothing is written either. `retry_in` (seconds,
    with release or defer): the backoff, not claimable again before the database's now() +
    retry_in. A handler that parks must `await ctx.journal.flush()` before the SQL call that
    parks the run: after it, the claim is gone and appends are fenced out."""

    status: OutcomeStatus
    result: dict[str, Any] | None = None
    error: str | None = None
    retry_in: float | None = None


RunHandler = Callable[[RunContext], Awaitable[Outcome]]


def importable_from_cwd() -> None:
    """Make a module in the directory the command was started from importable, as `python -m`
    does: the `runrow` script puts its own folder (the venv's bin) on sys.path instead, so
    `runrow worker --tools myapp.tools` run beside `myapp/` could not import it (the README
    audit) while `runrow serve --tools-module myapp.tools` could. Appended, not put first as
    `python -m` does: a file in that folder named like a package runrow imports later (httpx,
    anthropic) must not take its place."""
    import os
    import sys

    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())


def load_handler(spec: str) -> RunHandler:
    """`module:function`, for example `pyworker.worker.echo:handle`."""
    import importlib

    importable_from_cwd()

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--handler must be module:function, got {spec!r}")
    if module_name.startswith("."):  # import_module raises TypeError for a relative name
        raise ValueError(
            f"--handler {spec!r}: give the module's absolute dotted path, for example myapp.agent"
        )
    module = importlib.import_module(module_name)
    handler = getattr(module, attr, None)
    if not callable(handler):
        raise ValueError(f"--handler {spec!r}: {module_name} has no callable {attr!r}")
    return handler  # type: ignore[no-any-return]
