"""The contract between the run supervisor and the code that does a run's work."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from psycopg_pool import AsyncConnectionPool

from pyworker.db.api import ClaimedRun
from pyworker.worker.journal import RunJournal

OutcomeStatus = Literal["completed", "failed", "cancelled", "release", "parked"]


@dataclass
class RunContext:
    """What a handler gets. Watch `cancel` (stop requested: stop generating, return
    Outcome('cancelled'), the partial text already journaled stays) and never outlive `lost`
    (the supervisor cancels the handler task when the claim is lost)."""

    run: ClaimedRun
    pool: AsyncConnectionPool
    journal: RunJournal
    cancel: asyncio.Event
    lost: asyncio.Event
    log: logging.LoggerAdapter  # type: ignore[type-arg]
    worker_id: str
    config: dict[str, Any] = field(default_factory=dict)  # worker flags for handlers, e.g. tools_module


@dataclass(frozen=True)
class Outcome:
    """completed/failed/cancelled: finish_run with that status. release: release_run (the attempts
    policy requeues or fails it). parked: the handler already handed the run back in SQL (e.g.
    waiting on an approval); the supervisor writes nothing. A handler that parks must
    `await ctx.journal.flush()` before the SQL call that parks the run: after it, the claim
    is gone and appends are fenced out."""

    status: OutcomeStatus
    result: dict[str, Any] | None = None
    error: str | None = None


RunHandler = Callable[[RunContext], Awaitable[Outcome]]


def load_handler(spec: str) -> RunHandler:
    """`module:function`, for example `pyworker.worker.echo:handle`."""
    import importlib

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--handler must be module:function, got {spec!r}")
    module = importlib.import_module(module_name)
    handler = getattr(module, attr, None)
    if not callable(handler):
        raise ValueError(f"--handler {spec!r}: {module_name} has no callable {attr!r}")
    return handler  # type: ignore[no-any-return]
