"""Blocking calls in daemon threads of their own, never in asyncio's default pool."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from typing import Any


async def in_own_thread(fn: Callable[..., Any], /, **kwargs: Any) -> Any:
    """fn(**kwargs) in a daemon thread of its own, with the caller's context (trace spans).

    Not asyncio.to_thread: asyncio's default pool has min(32, cores + 4) threads (6 on 2 cores)
    and also resolves host names for psycopg's connects and httpx's requests. Sync tools that
    wait long took every thread, so a worker whose connections were cut could not look its
    database's host up again and gave every run up, though the database was there; at
    `--concurrency 10`, 4 of 10 tool calls waited for a thread; and a tool that never returns
    (its thread runs on after a stop) kept one for good, and held the process at exit. The same
    holds for serve's look-ups of a user's webhook host: a name whose DNS never answers holds its
    thread for the resolver's own timeout (about 30 s), long after the caller stopped waiting. A
    thread per call costs about 0.1 ms, nothing beside a tool's work or a DNS query, and is never
    waited for at exit. A caller that stops waiting (a timeout, a cancellation) leaves the
    thread to finish on its own; its result is dropped."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.cancelled():
            return  # the caller stopped waiting; the result is unused
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def target() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = context.run(fn, **kwargs)
        except BaseException as exc:  # the caller decides what fn's exception means
            error = exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the loop is closed: the process exited while fn ran on

    threading.Thread(target=target, name=f"runrow-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return await done
