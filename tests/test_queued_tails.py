"""Tails of queued runs: what a client waiting for its run to start costs the database.

`watch_runs` answers `queued` for a queued run (it is not locked, so that no claim skips it).
The hub asked again every 0.2 s and every such tail re-read the journal every second: each
waiting stream cost about a transaction a second, in a backlog, when the database is busiest
(the stream audit: 100 streams on queued runs 107 tx/s, on running runs 55). A registered
queued run's writes notify, and the hub asks again for all queued runs in one call and wakes
the tail when the run is claimed, so the tail backs its poll off; it still shows the claim and
the first events at once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from tail_support import append, claim, enqueue, private_database_url
from worker_support import wait_until_async

from pyworker.db import api, channels
from pyworker.db import tail as tail_module
from pyworker.db.cancel_safe_pool import CancelSafePool
from pyworker.db.hub import Hub
from pyworker.db.tail import Event, tail

__all__ = ["private_database_url"]  # the fixture, re-exported for pytest

TAILS = 20
WINDOW = 6.0


@pytest.fixture
async def pool(private_database_url: str) -> AsyncIterator[AsyncConnectionPool]:
    p = CancelSafePool(private_database_url, min_size=1, max_size=8, kwargs={"autocommit": True}, open=False)
    await p.open()
    yield p
    await p.close()


@pytest.fixture
async def hub(private_database_url: str) -> AsyncIterator[Hub]:
    h = Hub(private_database_url)
    await h.start()
    assert await h.wait_connected(5)
    yield h
    await h.stop()


@pytest.fixture
def sync_conn(private_database_url: str) -> AsyncIterator[psycopg.Connection]:
    with psycopg.connect(private_database_url, autocommit=True) as conn:
        yield conn


class Calls:
    """read_events and watch_runs calls, each one transaction of an autocommit connection."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads = 0
        self.watches = 0
        read, watch = tail_module.read_events, api.watch_runs

        async def counted_read(*args: Any, **kwargs: Any) -> list[Event]:
            self.reads += 1
            return await read(*args, **kwargs)

        async def counted_watch(*args: Any, **kwargs: Any) -> list[tuple[uuid.UUID, str]]:
            self.watches += 1
            return await watch(*args, **kwargs)

        monkeypatch.setattr(tail_module, "read_events", counted_read)
        monkeypatch.setattr(api, "watch_runs", counted_watch)


Seen = list[tuple[float, Event]]


async def follow(pool: AsyncConnectionPool, hub: Hub, run_id: uuid.UUID, seen: Seen) -> None:
    async with aclosing(tail(pool, hub, run_id, keepalive=15.0, poll_interval=1.0)) as items:
        async for item in items:
            if isinstance(item, Event):
                seen.append((time.monotonic(), item))


async def test_tails_of_queued_runs_back_their_polls_off(
    pool: AsyncConnectionPool, hub: Hub, sync_conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = [enqueue(sync_conn, f"queued {n}") for n in range(TAILS)]
    calls = Calls(monkeypatch)
    tasks = [asyncio.create_task(follow(pool, hub, run, [])) for run in runs]
    try:
        await asyncio.sleep(WINDOW)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for run in runs:
            sync_conn.execute("SELECT runrow.cancel_run(%s)", (run,))
    # Polling every second: a read at 0, 1, ... 6 s, 7 per tail (140), and a watch_runs call every
    # 0.2 s (30 more, plus one per subscription). Backed off: reads at 0, 1 and 3 s; watch_runs
    # for all queued runs together about once a second.
    print(f"{TAILS} tails on queued runs for {WINDOW:.0f} s: {calls.reads} reads, {calls.watches} watch_runs")
    assert calls.reads <= 4 * TAILS, calls.reads
    assert calls.watches <= TAILS + 2 * WINDOW, calls.watches


async def test_a_tail_of_a_queued_run_shows_its_claim_and_first_events_promptly(
    pool: AsyncConnectionPool, hub: Hub, sync_conn: psycopg.Connection
) -> None:
    run_id = enqueue(sync_conn)
    seen: Seen = []
    following = asyncio.create_task(follow(pool, hub, run_id, seen))
    try:
        await asyncio.sleep(4.5)  # its poll backed off to 4 s; between two of the hub's asks
        assert [e.type for _, e in seen] == ["user_message_created", "run_queued"]
        channel = channels.events_channel(run_id)
        assert hub.registered(channel) and not hub.armed(channel)
        # A claim notifies nobody: the hub's next ask sees it running and wakes the tail.
        claimed_at = time.monotonic()
        token = claim(sync_conn, run_id)
        await wait_until_async(lambda: len(seen) >= 3, within=5, what="event 3 streamed")
        at, event = seen[2]
        print(f"claim -> run_claimed streamed: {at - claimed_at:.3f} s")
        assert event.type == "run_claimed" and at - claimed_at < 2.0  # the next poll: 2.5 s after the claim
        # The run is watched now: a write wakes the tail at once.
        appended_at = time.monotonic()
        append(sync_conn, run_id, token, [{"type": "text_delta", "text": "hi"}])
        await wait_until_async(lambda: len(seen) >= 4, within=5, what="event 4 streamed")
        at, event = seen[3]
        print(f"append -> text_delta streamed: {at - appended_at:.3f} s")
        assert event.type == "text_delta" and at - appended_at < 2.0  # a wake, not a poll (4 s and more)
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


async def test_a_claim_and_its_first_write_reach_a_queued_runs_tail_at_once(
    pool: AsyncConnectionPool, hub: Hub, sync_conn: psycopg.Connection
) -> None:
    """A worker journals right after its claim (model_request, message_start): that write
    notifies the registered watch, so the tail shows the claim without waiting for the hub."""
    run_id = enqueue(sync_conn)
    seen: Seen = []
    following = asyncio.create_task(follow(pool, hub, run_id, seen))
    try:
        await asyncio.sleep(4.0)
        claimed_at = time.monotonic()
        token = claim(sync_conn, run_id)
        append(sync_conn, run_id, token, [{"type": "model_request", "step": 1}])
        await wait_until_async(lambda: len(seen) >= 4, within=5, what="event 4 streamed")
        at, _ = seen[3]
        print(f"claim + first write -> streamed: {at - claimed_at:.3f} s")
        assert [e.type for _, e in seen[2:4]] == ["run_claimed", "model_request"]
        assert at - claimed_at < 2.0  # a wake, not a poll (4 s and more)
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
