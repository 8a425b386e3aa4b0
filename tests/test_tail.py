"""The tail: every event exactly once, in order, across any number of reconnects.

A scripted writer (claim via SQL, append_events at irregular intervals, finish) streams a
run while a consumer tails it and drops the connection at random points: breaking out
after an item, or being cancelled mid-read or mid-wait. Each drop reconnects with a new
tail from the last seq seen. The RNG seed is printed so a failure can be replayed with
RUNROW_TAIL_SEED.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from tail_support import append, claim, enqueue, finished_run, journal, private_database_url

from pyworker.db.cancel_safe_pool import CancelSafePool
from pyworker.db.tail import Event, Keepalive, RunNotFound, tail

__all__ = ["private_database_url"]  # the fixture, re-exported for pytest


@pytest.fixture
async def pool(private_database_url: str) -> AsyncIterator[AsyncConnectionPool]:
    p = CancelSafePool(private_database_url, min_size=1, max_size=4, kwargs={"autocommit": True}, open=False)
    await p.open()
    yield p
    await p.close()


@pytest.fixture
async def hub(private_database_url: str) -> AsyncIterator[object]:
    try:
        from pyworker.db.hub import Hub
    except ImportError:
        pytest.skip("pyworker.db.hub has not landed yet")
    h = Hub(private_database_url)
    await h.start()
    yield h
    await h.stop()


@pytest.fixture
def sync_conn(private_database_url: str) -> AsyncIterator[psycopg.Connection]:
    with psycopg.connect(private_database_url, autocommit=True) as conn:
        yield conn


async def collect(items: AsyncIterator[object]) -> list:
    """Everything a tail yields until it ends by itself; a tail that never ends fails the test."""
    async with asyncio.timeout(10):
        return [i async for i in items]


def seeded_rng() -> random.Random:
    seed = int(os.environ.get("RUNROW_TAIL_SEED", random.randrange(2**32)))
    print(f"tail test seed: RUNROW_TAIL_SEED={seed}")
    return random.Random(seed)


async def write_run(url: str, run_id: uuid.UUID, token: uuid.UUID, rng: random.Random, batches: int) -> None:
    """Append `batches` batches of 1-5 deltas at irregular intervals, then finish completed."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for i in range(batches):
            events = [{"type": "text_delta", "text": f"{i}.{j} "} for j in range(rng.randint(1, 5))]
            if rng.random() < 0.1:
                events.append({"type": "tool_use", "name": "noop", "index": i})
            await conn.execute(
                "SELECT runrow.append_events(run_id => %s, claim_token => %s, events => %s::jsonb)",
                (run_id, token, json.dumps(events)),
            )
            await asyncio.sleep(rng.choice([0, 0, 0, 0.001, 0.003, 0.01, 0.03]))
        await conn.execute(
            "SELECT runrow.finish_run(run_id => %s, claim_token => %s, status => 'completed')",
            (run_id, token),
        )


async def consume_with_drops(
    pool: AsyncConnectionPool, hub: object, run_id: uuid.UUID, rng: random.Random, **kw: float
) -> tuple[list[Event], int]:
    """Tail to the end, dropping and rejoining at random; returns (events, reconnects)."""
    seen: list[Event] = []
    reconnects = 0
    while True:
        cursor = seen[-1].seq if seen else 0
        try:
            # A deadline cancels the tail wherever it is: mid-read, mid-wait, between items.
            async with asyncio.timeout(rng.uniform(0.0, 0.08)):
                async with aclosing(tail(pool, hub, run_id, from_seq=cursor, **kw)) as items:  # type: ignore[arg-type]
                    async for item in items:
                        if isinstance(item, Keepalive):
                            continue
                        seen.append(item)
                        if item.type == "complete":
                            return seen, reconnects
                        if rng.random() < 0.15:
                            break
        except TimeoutError:
            pass
        reconnects += 1


async def check_stream_with_drops(
    url: str, pool: AsyncConnectionPool, hub: object, sync_conn: psycopg.Connection, **kw: float
) -> None:
    rng = seeded_rng()
    run_id = enqueue(sync_conn)
    token = claim(sync_conn, run_id)
    writer = asyncio.create_task(write_run(url, run_id, token, rng, batches=120))
    seen, reconnects = await asyncio.wait_for(consume_with_drops(pool, hub, run_id, rng, **kw), timeout=60)
    await writer

    expected = journal(sync_conn, run_id)
    assert [e.seq for e in seen] == list(range(1, len(expected) + 1)), "every seq once, in order, no gaps"
    assert [(e.seq, e.payload) for e in seen] == expected
    assert seen[-1].type == "complete" and seen[-1].payload["status"] == "completed"
    assert [e.type for e in seen].count("complete") == 1
    print(f"{len(seen)} events over {reconnects} reconnects")
    assert reconnects >= 10, f"the test must actually reconnect (did {reconnects} times)"


async def test_exactly_once_in_order_across_random_reconnects_with_hub(
    private_database_url: str, pool: AsyncConnectionPool, hub: object, sync_conn: psycopg.Connection
) -> None:
    # keepalive long and no polling: progress can only come from notifications.
    await check_stream_with_drops(
        private_database_url, pool, hub, sync_conn, keepalive=30.0, poll_interval=30.0
    )


async def test_exactly_once_in_order_across_random_reconnects_polling(
    private_database_url: str, pool: AsyncConnectionPool, sync_conn: psycopg.Connection
) -> None:
    await check_stream_with_drops(
        private_database_url, pool, None, sync_conn, keepalive=1.0, poll_interval=0.01
    )


async def test_wakes_on_notification_not_on_timeout(
    pool: AsyncConnectionPool, hub: object, sync_conn: psycopg.Connection
) -> None:
    """A tail parked on the hub sees an append at once, far before its keepalive timeout."""
    run_id = enqueue(sync_conn)
    token = claim(sync_conn, run_id)
    async with aclosing(tail(pool, hub, run_id, keepalive=30.0)) as items:  # type: ignore[arg-type]
        first = [await anext(items), await anext(items), await anext(items)]
        assert [e.type for e in first] == ["user_message_created", "run_queued", "run_claimed"]  # type: ignore[union-attr]
        nxt = asyncio.ensure_future(anext(items))
        await asyncio.sleep(0.2)  # let the tail park in its wait
        assert not nxt.done()
        started = time.monotonic()
        await asyncio.to_thread(append, sync_conn, run_id, token, [{"type": "text_delta", "text": "x"}])
        event = await asyncio.wait_for(nxt, timeout=5)
        assert isinstance(event, Event) and event.payload == {"type": "text_delta", "text": "x"}
        assert time.monotonic() - started < 5


async def test_tail_of_a_finished_run_gets_everything_and_ends(
    pool: AsyncConnectionPool, sync_conn: psycopg.Connection
) -> None:
    run_id = finished_run(sync_conn, ["a", "b", "c"])
    items = await collect(tail(pool, None, run_id, keepalive=30.0))
    assert [(e.seq, e.payload) for e in items] == journal(sync_conn, run_id)  # type: ignore[union-attr]
    assert items[-1].type == "complete"  # type: ignore[union-attr]
    # Rejoining from the middle replays only what comes after the cursor.
    rest = await collect(tail(pool, None, run_id, from_seq=4, keepalive=30.0))
    assert [e.seq for e in rest] == list(range(5, len(items) + 1))  # type: ignore[union-attr]


async def test_pages_smaller_than_the_journal(
    pool: AsyncConnectionPool, sync_conn: psycopg.Connection
) -> None:
    run_id = finished_run(sync_conn, [str(i) for i in range(23)])
    items = await collect(tail(pool, None, run_id, page=4, keepalive=30.0))
    assert [(e.seq, e.payload) for e in items] == journal(sync_conn, run_id)  # type: ignore[union-attr]


async def test_trimmed_run_ends_with_the_synthesized_complete(
    pool: AsyncConnectionPool, sync_conn: psycopg.Connection
) -> None:
    run_id = finished_run(sync_conn, ["gone"], status="failed")
    sync_conn.execute("SELECT runrow.trim_journal(older_than => interval '0')")
    items = await collect(tail(pool, None, run_id, keepalive=30.0))
    assert len(items) == 1
    (end,) = items
    assert isinstance(end, Event) and end.seq == 1 and end.type == "complete"
    assert end.payload["status"] == "failed" and end.payload["synthesized"] is True
    # A viewer that had seen seq 5 before the trim still gets an ending after its cursor.
    items = await collect(tail(pool, None, run_id, from_seq=5, keepalive=30.0))
    assert [(e.seq, e.type) for e in items] == [(6, "complete")]  # type: ignore[union-attr]


async def test_unknown_run_raises_run_not_found(pool: AsyncConnectionPool) -> None:
    missing = uuid.uuid4()
    with pytest.raises(RunNotFound, match=f"run {missing} does not exist"):
        async for _ in tail(pool, None, missing):
            pass


async def test_keepalive_when_nothing_happens(
    pool: AsyncConnectionPool, sync_conn: psycopg.Connection
) -> None:
    run_id = enqueue(sync_conn)
    claim(sync_conn, run_id)
    async with aclosing(tail(pool, None, run_id, keepalive=0.3, poll_interval=0.05)) as items:
        got = [await anext(items) for _ in range(5)]
    assert [type(i).__name__ for i in got] == ["Event", "Event", "Event", "Keepalive", "Keepalive"]


async def test_cancelled_run_streams_cancel_requested_then_complete(
    pool: AsyncConnectionPool, sync_conn: psycopg.Connection
) -> None:
    run_id = enqueue(sync_conn)
    token = claim(sync_conn, run_id)
    append(sync_conn, run_id, token, [{"type": "text_delta", "text": "partial"}])
    sync_conn.execute("SELECT runrow.cancel_run(run_id => %s)", (run_id,))
    sync_conn.execute(
        "SELECT runrow.finish_run(run_id => %s, claim_token => %s, status => 'cancelled')", (run_id, token)
    )
    types = [i.type for i in await collect(tail(pool, None, run_id, keepalive=30.0))]  # type: ignore[union-attr]
    assert types[-3:] == ["text_delta", "cancel_requested", "complete"]


async def test_hub_down_falls_back_to_polling(
    private_database_url: str, pool: AsyncConnectionPool, sync_conn: psycopg.Connection
) -> None:
    """A hub that is not connected delivers nothing; the tail still finishes, on its poll interval."""
    from pyworker.db.hub import Hub

    down = Hub(private_database_url)  # never started: connected is False, no LISTEN
    await check_stream_with_drops(
        private_database_url, pool, down, sync_conn, keepalive=30.0, poll_interval=0.01
    )


async def test_rejoining_at_or_past_the_complete_ends_at_once(
    pool: AsyncConnectionPool, hub: object, sync_conn: psycopg.Connection
) -> None:
    """A consumer that already saw the complete and reconnects gets nothing and does not hang."""
    run_id = finished_run(sync_conn, ["a"])
    last = journal(sync_conn, run_id)[-1][0]
    assert await collect(tail(pool, hub, run_id, from_seq=last, keepalive=30.0)) == []  # type: ignore[arg-type]
    assert await collect(tail(pool, hub, run_id, from_seq=last + 50, keepalive=30.0)) == []  # type: ignore[arg-type]
    # One before the end still gets the complete itself.
    (end,) = await collect(tail(pool, hub, run_id, from_seq=last - 1, keepalive=30.0))  # type: ignore[arg-type]
    assert end.type == "complete"


class AppendAfterRead:
    """A pool whose connections, after the tail's first read returns, append one event: the
    append commits (and notifies) between the tail's read and its wait, deterministically."""

    def __init__(self, pool: AsyncConnectionPool, append_once: Callable[[], Awaitable[None]]) -> None:
        self.pool = pool
        self.append_once: Callable[[], Awaitable[None]] | None = append_once

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        async with self.pool.connection() as conn:
            yield conn
        hook, self.append_once = self.append_once, None
        if hook is not None:
            await hook()


async def test_an_append_between_read_and_wait_is_not_missed(
    pool: AsyncConnectionPool, hub: object, sync_conn: psycopg.Connection
) -> None:
    """Subscribed before reading, wakes drained before (not after) each read: the append that
    lands right after the catch-up read wakes the tail at once, not after its 30 s timeout."""
    run_id = enqueue(sync_conn)
    token = claim(sync_conn, run_id)

    async def append_late() -> None:
        await asyncio.to_thread(append, sync_conn, run_id, token, [{"type": "text_delta", "text": "late"}])

    racy = AppendAfterRead(pool, append_late)
    async with aclosing(tail(racy, hub, run_id, keepalive=30.0, poll_interval=30.0)) as items:  # type: ignore[arg-type]
        async with asyncio.timeout(5):
            got = [await anext(items) for _ in range(4)]
    assert [e.type for e in got] == ["user_message_created", "run_queued", "run_claimed", "text_delta"]  # type: ignore[union-attr]


async def test_a_cancel_that_lands_with_a_wake_is_not_lost() -> None:
    """The tail's wait, cancelled in the loop turn a wake arrives in (Ctrl-C of `runrow demo`
    at the moment a notification came: tests/test_demo.py saw the demo run on to exit 0). On
    Python 3.11 asyncio.wait_for returned the wake and dropped the cancellation."""
    from pyworker.db.tail import _wait

    queue: asyncio.Queue[str] = asyncio.Queue()
    waiting = asyncio.create_task(_wait(queue, 10))
    await asyncio.sleep(0.01)  # parked in queue.get()
    queue.put_nowait("7")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
