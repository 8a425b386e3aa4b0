"""Bounded waits that never lose a cancellation: use these, not `asyncio.wait_for`.

On Python 3.11 `asyncio.wait_for` has a defect (CPython gh-86296, fixed in 3.12, where
wait_for is built on `asyncio.timeout`): when the awaited thing completes in the same loop
turn as the waiting task is cancelled, it returns the result and drops the cancellation. The
task then runs on after `cancel()`: a worker that ignores its SIGTERM drain, a Ctrl-C that
does nothing. `asyncio.timeout` awaits in the caller's own task, so a cancellation always
reaches the awaited thing and is raised.

Nothing awaited here is wrapped in a task either, so a timeout or a cancellation that cuts a
`queue.get()` short leaves the item in the queue: a wake is never lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def within(aw: Awaitable[T], seconds: float | None) -> T | None:
    """The result of `aw`, or None when `seconds` pass first (None: no limit). Only for
    awaitables that never yield None themselves (a queue of payloads, say). A cancellation of
    the caller is raised, even one that lands in the turn `aw` completes in."""
    deadline = asyncio.timeout(seconds)
    try:
        async with deadline:
            return await aw
    except TimeoutError:
        if not deadline.expired():
            raise  # raised by `aw` itself, not our deadline
        return None


async def wait_event(event: asyncio.Event, seconds: float | None) -> bool:
    """True once `event` is set, False when `seconds` pass first (None: no limit). A
    cancellation of the caller is raised, even one that lands in the turn the event is set."""
    return await within(event.wait(), seconds) is not None


class WatchedEvent(asyncio.Event):
    """An asyncio.Event that also calls back: `watch(fn)` has fn() called when it is set (at
    once if it already is), so a caller can wake on it without a task waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self._watchers: list[Callable[[], None]] = []

    def set(self) -> None:
        if self.is_set():
            return
        super().set()
        for fn in list(self._watchers):
            fn()

    def watch(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call fn() once the event is set; returns the function that stops watching."""
        if self.is_set():
            fn()
            return lambda: None
        self._watchers.append(fn)

        def unwatch() -> None:
            if fn in self._watchers:
                self._watchers.remove(fn)

        return unwatch
