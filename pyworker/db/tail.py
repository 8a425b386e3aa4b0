"""The tail: follow one run's journal from a cursor until its `complete` event.

One implementation for the CLI and the HTTP service. The journal (`runrow.read_events`) is
the truth; the run's NOTIFY channel is only a hint that new rows may exist, sent only while a
tail watches the run (the hub registers the watch, `runrow.watch_runs`). So the tail
subscribes *before* its catch-up read (an event committed between read and subscribe would
otherwise wake no one), re-reads on every wake and on every timeout, and works with no hub
at all by polling. Each event carries its seq: a consumer that drops reconnects with
`from_seq` = the last seq it saw and gets everything after it, exactly once, in order.

Consume it with `contextlib.aclosing` so that breaking out early releases the subscription
at once rather than when the generator is garbage-collected:

    async with aclosing(tail(pool, hub, run_id, from_seq=n)) as items:
        async for item in items:
            ...
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool

from pyworker.db.aio import within
from pyworker.db.api import Event, read_events
from pyworker.db.channels import events_channel

if TYPE_CHECKING:
    from pyworker.db.hub import Hub


# How often a tail re-reads when no notification can reach it (no hub, or hub down).
POLL_INTERVAL = 1.0
# The first re-read after a wake whose rows were not readable yet; doubles up to the poll interval.
CATCH_UP_FIRST = 0.01

TERMINAL = frozenset({"completed", "failed", "cancelled", "dead"})


class RunNotFound(LookupError):
    """The run id names no run (read_events raised P0002)."""

    def __init__(self, run_id: UUID) -> None:
        super().__init__(f"run {run_id} does not exist")
        self.run_id = run_id


class CursorPastEnd(ValueError):
    """A live run's journal has no event at the cursor: a stale cursor, or another run's."""

    def __init__(self, run_id: UUID, cursor: int) -> None:
        super().__init__(
            f"cursor {cursor} is past the end of run {run_id}'s journal: it has no event {cursor}"
        )
        self.run_id = run_id
        self.cursor = cursor


@dataclass(frozen=True)
class Keepalive:
    """Nothing new for `keepalive` seconds; an SSE server sends a comment to keep proxies warm."""


TailItem = Event | Keepalive


async def tail(
    pool: AsyncConnectionPool,
    hub: Hub | None,
    run_id: UUID,
    from_seq: int = 0,
    keepalive: float = 15.0,
    page: int = 500,
    poll_interval: float = POLL_INTERVAL,
    replica: bool = False,
) -> AsyncIterator[TailItem]:
    """Yield the run's events with seq > from_seq, in order, ending after the first `complete`.

    A tail whose cursor is at or past the journal's own complete yields nothing and ends once
    the run is terminal: at once when it already is (the consumer saw the ending before it
    reconnected), or when it ends, for a cursor past the end of a live run (a stale cursor;
    `check_cursor` refuses those up front).

    Yields a Keepalive after `keepalive` seconds without events. Raises RunNotFound for an
    unknown run. With `hub` None, or while the hub is disconnected, it re-reads every
    `poll_interval` seconds instead of waiting for a notification. On a queued run whose watch
    the hub registered (`Hub.registered`), the wait doubles from `poll_interval` up to the
    keepalive: the hub wakes the tail when the run is claimed or ends, and the run's writes
    notify, so the poll only covers a write that raced the registration.

    `replica`: `pool` reads a hot standby while `hub` listens on the primary. The standby shows
    a prefix of the primary's commits, so a run it does not have yet is lag, not absence (the
    caller checked the primary), and a notification can arrive before the rows it announces:
    the tail then re-reads, backing off up to `poll_interval`, until it has reached the seq the
    notification named.
    """
    cursor = from_seq
    loop = asyncio.get_running_loop()
    channel = events_channel(run_id)
    subscription = hub.subscribe(channel) if hub is not None else _no_subscription()
    announced = 0  # the highest seq a notification named: the primary has journaled that far
    catch_up = 0.0
    queued_wait = 0.0  # the last wait on a registered queued run; doubles while nothing comes
    async with subscription as queue:
        last_yield = loop.time()
        while True:
            # Clear pending wakes before reading, never after: a wake that arrives after
            # this point is for a row the read below may not see, and must survive.
            announced = max(announced, _drain(queue))
            # A hub that is down now may have missed the notification for a row committed
            # before it re-LISTENs, and a run whose watch is not confirmed may be written
            # without one; only a wait that began with the channel armed can trust it.
            trusted = hub is not None and hub.armed(channel)
            registered = not trusted and hub is not None and hub.registered(channel)
            events = await _read(pool, run_id, cursor, page, missing_ok=replica)
            if events:
                queued_wait = 0.0
            for event in events:
                if seen_the_end(event):
                    return  # the journal's own complete is at or before the cursor
                cursor = event.seq
                last_yield = loop.time()
                yield event
                if event.type == "complete":
                    return
            if len(events) == page:
                continue  # more rows are already there: no waiting
            now = loop.time()
            if now - last_yield >= keepalive:
                last_yield = now
                yield Keepalive()
            until_keepalive = max(0.0, keepalive - (loop.time() - last_yield))
            if trusted:
                timeout = until_keepalive
            elif registered:
                # Polling a queued run every poll_interval cost each waiting client about a
                # transaction a second, in a backlog, when the database is busiest.
                queued_wait = min(max(poll_interval, queued_wait * 2), max(poll_interval, keepalive))
                timeout = min(queued_wait, until_keepalive)
            else:
                queued_wait = 0.0
                timeout = min(poll_interval, until_keepalive)
            if cursor < announced:
                # The rows a wake announced are not readable here yet (a lagging standby), and
                # that wake is spent: no later one may come (a complete is the last).
                catch_up = min(poll_interval, max(CATCH_UP_FIRST, catch_up * 2))
                timeout = min(timeout, catch_up)
            else:
                catch_up = 0.0
            announced = max(announced, await _wait(queue, timeout))


def seen_the_end(event: Event) -> bool:
    """The complete read_events synthesizes for a cursor at or past the journal's own complete
    (it names that seq: `complete_seq`): the reader's cursor is already beyond the ending."""
    return (
        event.type == "complete"
        and event.payload.get("synthesized") is True
        and event.payload.get("complete_seq") is not None
    )


async def check_cursor(pool: AsyncConnectionPool, run_id: UUID, cursor: int) -> bool:
    """Where a consumer's cursor stands, before it follows: True when the run is terminal and
    the cursor is at or past its complete (nothing left to show); False when there is something
    to follow. Raises CursorPastEnd when the run is live and its journal has no event `cursor`
    (waiting would show nothing until the run ends), RunNotFound for an unknown run."""
    if cursor <= 0:
        return False
    # One page of one event from just before the cursor: the event the cursor names, or, when
    # the journal has none, a synthesized complete (terminal run) or nothing (live run).
    events = await _read(pool, run_id, cursor - 1, 1)
    if not events:
        raise CursorPastEnd(run_id, cursor)
    (named,) = events
    if named.type == "complete" and named.payload.get("synthesized") is True:
        return named.payload.get("complete_seq") is not None  # else a trimmed journal: show its ending
    return named.type == "complete"


async def run_status(pool: AsyncConnectionPool, run_id: UUID) -> str:
    """The run's status now (runrow.get_run); RunNotFound for an unknown run."""
    try:
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT status FROM runrow.get_run(run_id => %s)", (run_id,))
            row = await cur.fetchone()
    except psycopg.errors.NoDataFound as exc:
        raise RunNotFound(run_id) from exc
    if row is None:
        raise RunNotFound(run_id)
    return str(row[0])


async def _read(
    pool: AsyncConnectionPool, run_id: UUID, cursor: int, page: int, *, missing_ok: bool = False
) -> list[Event]:
    # A pooled connection per read: a tail holds no connection while it waits.
    try:
        async with pool.connection() as conn:
            return await read_events(conn, run_id, cursor, page)
    except psycopg.errors.NoDataFound as exc:
        if missing_ok:
            return []
        raise RunNotFound(run_id) from exc


def _drain(queue: asyncio.Queue[Any] | None) -> int:
    """Empty the queue; the highest seq its payloads named (the hub's reconnect wake names none)."""
    highest = 0
    if queue is None:
        return highest
    while True:
        try:
            payload = queue.get_nowait()
        except asyncio.QueueEmpty:
            return highest
        highest = max(highest, _seq(payload))


async def _wait(queue: asyncio.Queue[Any] | None, seconds: float) -> int:
    """Sleep until a wake or the timeout; the seq the wake named (0: none, or no wake)."""
    if queue is None:
        await asyncio.sleep(seconds)
        return 0
    # pyworker.db.aio, not wait_for: on Python 3.11 wait_for returns the item when a wake and a
    # cancellation land in the same loop turn, and the cancellation (Ctrl-C of `runrow demo` or
    # `runrow tail`, a client gone) is lost. No wake (None) is seq 0.
    return _seq(await within(queue.get(), seconds))


def _seq(payload: object) -> int:
    # Journal wakes carry the run's last seq; the hub's reconnect wake carries nothing.
    return int(payload) if isinstance(payload, str) and payload.isdigit() else 0


@contextlib.asynccontextmanager
async def _no_subscription() -> AsyncIterator[None]:
    yield None
