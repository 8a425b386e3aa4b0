"""pyworker/db/aio.py: bounded waits that never drop a cancellation (Python 3.11's
asyncio.wait_for does when the awaited thing completes in the turn the waiter is cancelled)
and never lose a queued wake. Then the same collision at real call sites: the heartbeat's
beat wait, the webhook deliverer's idle wait, the hub's wait for its connection.

Each collision is forced deterministically: the waiter parks, then one synchronous stretch
completes what it waits on and cancels it, so both land in the same loop turn. No database.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from psycopg_pool import AsyncConnectionPool

from pyworker.db.aio import WatchedEvent, wait_event, within
from pyworker.db.api import ClaimedRun
from pyworker.db.hub import Hub
from pyworker.db.retry import DatabaseUnavailable, Retry
from pyworker.worker.heartbeat import heartbeat_loop
from pyworker.worker.webhooks import _idle


async def parked() -> None:
    """Enough loop turns for a waiter to park (wait_for needs two: it wraps in a task)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_within_returns_the_item_or_none_when_the_time_passes() -> None:
    queue: asyncio.Queue[str] = asyncio.Queue()
    queue.put_nowait("a")
    assert await within(queue.get(), 10) == "a"
    assert await within(queue.get(), 0.01) is None


async def test_within_raises_a_timeout_of_the_awaited_thing_itself() -> None:
    async def times_out() -> str:
        raise TimeoutError("the awaited call's own timeout")

    with pytest.raises(TimeoutError, match="own timeout"):
        await within(times_out(), 10)


async def test_wait_event_says_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, 10) is True
    assert await wait_event(event, None) is True


async def test_a_cancel_that_lands_with_a_queue_wake_is_raised_and_the_wake_kept() -> None:
    queue: asyncio.Queue[str] = asyncio.Queue()
    waiting = asyncio.create_task(within(queue.get(), 10))
    await parked()
    queue.put_nowait("wake")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert queue.get_nowait() == "wake", "the cut-short get() left the item in the queue"


async def test_a_cancel_that_lands_with_an_event_set_is_raised() -> None:
    event = asyncio.Event()
    waiting = asyncio.create_task(wait_event(event, 10))
    await parked()
    event.set()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


@pytest.mark.parametrize("put_first", [True, False], ids=["put-then-deadline", "deadline-then-put"])
async def test_a_deadline_that_lands_with_a_wake_loses_no_wake(put_first: bool) -> None:
    """A zero deadline fires on the loop's next turn; the put is scheduled just before or
    just after it. Either the item is returned or it is still in the queue."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str] = asyncio.Queue()
    waiting = asyncio.create_task(within(queue.get(), 0))
    if put_first:
        loop.call_soon(queue.put_nowait, "wake")
    else:
        loop.call_soon(loop.call_soon, queue.put_nowait, "wake")
    got = await waiting
    assert got == "wake" or (got is None and queue.get_nowait() == "wake")


def test_a_watched_event_calls_back_once_and_at_once_when_already_set() -> None:
    event, calls = WatchedEvent(), []
    unwatch = event.watch(lambda: calls.append("a"))
    event.watch(lambda: calls.append("b"))
    unwatch()
    event.set()
    event.set()
    assert calls == ["b"] and event.is_set()
    event.watch(lambda: calls.append("c"))
    assert calls == ["b", "c"]


# --- the call sites ----------------------------------------------------------------------


class CountingRetry:
    """Stands in for Retry: counts the heartbeats made, and gives the run up on the first."""

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, pool: object, fn: Callable[[Any], Awaitable[Any]], what: str) -> Any:
        self.calls += 1
        raise DatabaseUnavailable(what)


def a_run() -> ClaimedRun:
    return ClaimedRun(
        run_id=uuid.uuid4(),
        claim_token=uuid.uuid4(),
        conversation_id=uuid.uuid4(),
        attempt=1,
        max_attempts=3,
        model="m",
        prompt_id="p",
        system_prompt=None,
        tools=None,
        user_id=None,
        user_message_id=uuid.uuid4(),
        metadata={},
        claim_expires_at=datetime.now(UTC),
    )


async def test_the_heartbeat_stops_on_a_cancel_that_lands_with_a_beat_request() -> None:
    """The supervisor cancels the heartbeat when the run ends; a beat asked for in that same
    turn must not make it beat once more (on a run that is over) before it stops."""
    beat, lost, retry = asyncio.Event(), asyncio.Event(), CountingRetry()
    log = logging.LoggerAdapter(logging.getLogger("runrow.test"), {})
    loop_task = asyncio.create_task(
        heartbeat_loop(
            cast(AsyncConnectionPool, None),
            a_run(),
            300,
            cancel=asyncio.Event(),
            lost=lost,
            log=log,
            beat=beat,
            retry=cast(Retry, retry),
        )
    )
    await parked()
    beat.set()
    loop_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop_task
    assert retry.calls == 0 and not lost.is_set()


async def test_the_webhook_idle_wait_stops_on_a_cancel_that_lands_with_a_wake() -> None:
    """The deliverer is cancelled on SIGTERM drain; a wake in that turn must not swallow it."""
    wakes: asyncio.Queue[str] = asyncio.Queue()
    idle = asyncio.create_task(_idle(wakes, 10))
    await parked()
    wakes.put_nowait("enqueued")
    idle.cancel()
    with pytest.raises(asyncio.CancelledError):
        await idle


async def test_the_hub_wait_for_its_connection_stops_on_a_cancel_that_lands_with_it() -> None:
    hub = Hub("postgresql://never-connected.invalid/runrow")  # not started: never connects
    waiting = asyncio.create_task(hub.wait_connected(10))
    await parked()
    hub._connected.set()  # what the hub's supervisor does once it is connected
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
