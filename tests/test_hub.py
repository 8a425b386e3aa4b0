"""The hub: one LISTEN connection multiplexing channels; bounded queues that drop; a killed
backend means polling (slower, never wrong) until the hub reconnects and re-LISTENs."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import psycopg
from psycopg_pool import AsyncConnectionPool
from tail_support import append as tail_append
from tail_support import claim as tail_claim
from tail_support import enqueue as tail_enqueue
from worker_support import db, enqueue_echo, in_process_dispatcher, pool, run_row, wait_until_async, worker_db

from pyworker.db import channels
from pyworker.db.hub import RECONNECT_WAKE, Hub
from pyworker.db.tail import Keepalive, tail
from pyworker.worker.echo import handle as echo
from pyworker.worker.journal import JournalWriter

__all__ = ["db", "pool", "worker_db"]


async def next_payload(queue: asyncio.Queue[str], within: float = 5) -> str:
    return await asyncio.wait_for(queue.get(), within)


def notify(conn: psycopg.Connection, channel: str, *payloads: str) -> None:
    with conn.transaction():
        for p in payloads:
            conn.execute("SELECT pg_notify(%s, %s)", (channel, p))


async def test_subscribers_share_one_listen_and_the_last_one_unlistens(worker_db: str, db) -> None:
    hub = Hub(worker_db)
    await hub.start()
    try:
        assert await hub.wait_connected(5)
        async with hub.subscribe("chan_a") as q1, hub.subscribe("chan_a") as q2:
            notify(db, "chan_a", "one")
            assert await next_payload(q1) == "one"
            assert await next_payload(q2) == "one"
            async with hub.subscribe("chan_b") as qb:
                notify(db, "chan_b", "two")
                assert await next_payload(qb) == "two"
                assert q1.empty()
            await asyncio.sleep(0)  # let the supervisor apply the UNLISTEN nudge
        for _ in range(100):
            if not hub._listening:
                break
            await asyncio.sleep(0.01)
        assert hub._listening == set()
    finally:
        await hub.stop()


async def test_resubscribing_while_an_unlisten_is_in_flight_still_listens(worker_db: str, db) -> None:
    hub = Hub(worker_db)
    await hub.start()
    try:
        assert await hub.wait_connected(5)
        for i in range(60):
            async with hub.subscribe("flip"):
                pass  # leaving queues an UNLISTEN ...
            for _ in range(i % 12):  # ... let the supervisor get a varying way into it ...
                await asyncio.sleep(0)
            async with hub.subscribe("flip") as q:  # ... which must not undo this LISTEN
                notify(db, "flip", str(i))
                assert await next_payload(q) == str(i)
    finally:
        await hub.stop()


async def test_full_queue_drops_without_blocking_other_subscribers(worker_db: str, db) -> None:
    hub = Hub(worker_db, queue_size=2)
    await hub.start()
    try:
        assert await hub.wait_connected(5)
        async with hub.subscribe("slow") as slow, hub.subscribe("fast") as fast:
            notify(db, "slow", *[f"p{i}" for i in range(10)])
            notify(db, "fast", "sentinel")
            assert await next_payload(fast) == "sentinel"  # the hub was not blocked by the full queue
            assert slow.qsize() == 2
            assert [slow.get_nowait(), slow.get_nowait()] == ["p0", "p1"]
            assert hub.dropped == 8
    finally:
        await hub.stop()


async def test_terminated_hub_backend_falls_back_to_polling_then_recovers(
    worker_db: str, db, pool: AsyncConnectionPool
) -> None:
    name = f"runrow-hub-{uuid.uuid4().hex[:8]}"
    # A long reconnect backoff keeps the hub down long enough to watch the poll fallback.
    hub = Hub(worker_db, application_name=name, backoff_initial=6.0, backoff_max=6.0)
    await hub.start()
    writer = JournalWriter(pool)
    await writer.start()
    dispatcher = in_process_dispatcher(
        pool, writer, echo, "hub-test", concurrency=1, lease_seconds=2, hub=hub, poll_seconds=0.5
    )
    try:
        assert await hub.wait_connected(5)
        async with hub.subscribe(channels.ENQUEUED) as wakes:
            await dispatcher.start()
            first = enqueue_echo(db, "while the hub is up", duration=0.05)
            uuid.UUID(await next_payload(wakes))  # the NOTIFY path works: payload = conversation_id
            await wait_until_async(lambda: run_row(db, first)["status"] == "completed")

            pid = db.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone()[0]
            assert pid == hub.backend_pid
            db.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await wait_until_async(lambda: not hub.connected)

            enqueued = time.monotonic()
            second = enqueue_echo(db, "while the hub is down", duration=0.05)
            await wait_until_async(lambda: run_row(db, second)["status"] != "queued")
            assert not hub.connected  # claimed by the poll tick, not by a wake
            assert time.monotonic() - enqueued < 2.0
            await wait_until_async(lambda: run_row(db, second)["status"] == "completed")

            while not wakes.empty():
                wakes.get_nowait()
            assert await hub.wait_connected(15)
            assert await next_payload(wakes) == RECONNECT_WAKE  # something may have changed while down
            new_pid = db.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone()[0]
            assert new_pid == hub.backend_pid != pid
            notify(db, channels.ENQUEUED, "after-reconnect")
            assert await next_payload(wakes) == "after-reconnect"  # re-LISTENed
    finally:
        await dispatcher.stop_claiming()
        await asyncio.gather(*dispatcher.tasks(), return_exceptions=True)
        await writer.stop()
        await hub.stop()


async def test_a_trusted_wait_falls_back_to_polling_as_soon_as_the_hub_loses_its_connection(
    worker_db: str, db, pool: AsyncConnectionPool
) -> None:
    """A tail whose run's channel was armed waited for a wake up to its keepalive. When the hub's
    connection was lost, only the reconnect woke it, so while the LISTEN stayed down (its
    --listen-url member dead, the pool fine) a stream re-read only every keepalive (the failover
    audit's suspicion). The loss now wakes every subscriber, which polls until the hub is back."""
    name = f"runrow-hub-{uuid.uuid4().hex[:8]}"
    hub = Hub(worker_db, application_name=name, backoff_initial=6.0, backoff_max=6.0)
    await hub.start()
    run_id = tail_enqueue(db)
    token = tail_claim(db, run_id)
    seen: list[tuple[int, float]] = []

    async def follow() -> None:
        async for item in tail(pool, hub, run_id, keepalive=30.0, poll_interval=0.5):
            if not isinstance(item, Keepalive):
                seen.append((item.seq, time.monotonic()))

    following = asyncio.create_task(follow())
    try:
        assert await hub.wait_connected(5)
        channel = channels.events_channel(run_id)
        await wait_until_async(lambda: hub.armed(channel), what="the run's channel armed")
        await wait_until_async(lambda: len(seen) == 3, what="the journal so far")  # queued, claimed
        ours = "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
        db.execute("SELECT pg_terminate_backend(%s)", (db.execute(ours, (name,)).fetchone()[0],))
        await wait_until_async(lambda: not hub.connected, what="the hub to notice")
        appended = time.monotonic()
        seq = tail_append(db, run_id, token, [{"type": "text_delta", "index": 0, "text": "hi"}])
        await wait_until_async(lambda: any(s == seq for s, _ in seen), within=10, what="the event")
        took = next(t for s, t in seen if s == seq) - appended
        assert took < 2.0 and not hub.connected, f"{took:.1f}s: the event waited for the hub's return"
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
        await hub.stop()
