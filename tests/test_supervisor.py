"""The run supervisor in-process: cancel by NOTIFY (fast, confirmed by the row; a forged NOTIFY
stops nothing) and by the heartbeat poll (no hub),
the partial text kept; a raising handler is released to the attempts policy; every log line
about a run carries run_id, conversation_id and attempt."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

import pytest
from psycopg_pool import AsyncConnectionPool
from worker_support import (
    db,
    enqueue_echo,
    events,
    pool,
    run_row,
    streamed_text,
    wait_until_async,
    worker_db,
)

from pyworker.db.hub import Hub
from pyworker.worker.dispatcher import Dispatcher
from pyworker.worker.echo import handle as echo
from pyworker.worker.handler import Outcome, RunContext
from pyworker.worker.journal import JournalWriter

__all__ = ["db", "pool", "worker_db"]

LONG = "a long answer that gets cut off " * 20


@pytest.fixture
async def start(worker_db: str, pool: AsyncConnectionPool) -> AsyncIterator[Callable[..., object]]:
    writer = JournalWriter(pool)
    await writer.start()
    hubs: list[Hub] = []
    dispatchers: list[Dispatcher] = []
    watchers: list[asyncio.Task[None]] = []

    async def _start(*, hub: bool, lease: int) -> Dispatcher:
        h = None
        if hub:
            h = Hub(worker_db)
            await h.start()
            assert await h.wait_connected(5)
            hubs.append(h)
        d = Dispatcher(
            pool=pool,
            hub=h,
            writer=writer,
            handler=echo,
            concurrency=2,
            lease_seconds=lease,
            poll_seconds=0.2,
            worker_id="in-process",
        )
        watchers.append(asyncio.create_task(d.watch_cancels()))
        await asyncio.sleep(0.05)  # let the cancel watcher subscribe
        await d.start()
        dispatchers.append(d)
        return d

    yield _start
    for d in dispatchers:
        await d.stop_claiming()
        for sup, _ in d.in_flight.values():
            sup.abandon("test over")
        await asyncio.gather(*d.tasks(), return_exceptions=True)
    for t in watchers:
        t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await t
    await writer.stop()
    for h in hubs:
        await h.stop()


async def cancel_and_time(db, run) -> float:  # type: ignore[no-untyped-def]
    await wait_until_async(lambda: run_row(db, run)["status"] == "running" and streamed_text(db, run))
    t0 = time.monotonic()
    assert db.execute("SELECT runrow.cancel_run(run_id => %s)", (run,)).fetchone()[0]
    await wait_until_async(lambda: run_row(db, run)["status"] != "running")
    return time.monotonic() - t0


def assert_cancelled_keeping_partial_text(db, run) -> None:  # type: ignore[no-untyped-def]
    row = run_row(db, run)
    assert row["status"] == "cancelled"
    partial = streamed_text(db, run)
    assert partial and LONG.startswith(partial) and partial != LONG
    assert row["result"]["text"] == partial
    endings = [e for e in events(db, run) if e["type"] == "complete"]
    assert len(endings) == 1 and endings[0]["status"] == "cancelled"


async def test_cancel_by_notify_is_fast_and_keeps_partial_text(start, db, caplog) -> None:
    caplog.set_level(logging.INFO, logger="runrow")
    await start(hub=True, lease=30)  # heartbeat every 10 s: only the NOTIFY can be this fast
    run = enqueue_echo(db, LONG, duration=30)
    took = await cancel_and_time(db, run)
    assert took < 3
    assert_cancelled_keeping_partial_text(db, run)
    lines = [r for r in caplog.records if r.name == "runrow.run"]
    assert lines and all(
        (r.run_id, r.conversation_id, r.attempt) == (str(run), str(lines[0].conversation_id), 1)
        for r in lines
    )


async def test_cancel_by_heartbeat_poll_without_a_hub(start, db) -> None:
    await start(hub=False, lease=1)  # no NOTIFY at all: the heartbeat (every 1/3 s) is the cancel poll
    run = enqueue_echo(db, LONG, duration=30)
    took = await cancel_and_time(db, run)
    assert took < 3
    assert_cancelled_keeping_partial_text(db, run)


async def test_a_forged_cancel_notify_stops_nothing(start, db) -> None:
    """Any login may NOTIFY any channel (a role with no runrow grant cancelled a running run
    this way): the hint makes the worker beat at once, and only the row's cancel_requested stops."""
    await start(hub=True, lease=30)  # heartbeat every 10 s: the beat below is the hint's
    run = enqueue_echo(db, LONG, duration=2)
    await wait_until_async(lambda: run_row(db, run)["status"] == "running" and streamed_text(db, run))
    before = run_row(db, run)["claim_expires_at"]
    db.execute("SELECT pg_notify('runrow_cancel', %s)", (str(run),))
    await wait_until_async(lambda: run_row(db, run)["claim_expires_at"] > before, 5, "the hint's beat")
    await wait_until_async(lambda: run_row(db, run)["status"] != "running", 10, "the run to end")
    row = run_row(db, run)
    assert (row["status"], row["cancel_requested"], row["result"]["text"]) == ("completed", False, LONG)


async def test_raising_handler_is_released_to_the_attempts_policy(start, db) -> None:
    await start(hub=True, lease=2)
    run = enqueue_echo(db, "doomed", duration=0.1, max_attempts=2, fail=True)
    await wait_until_async(lambda: run_row(db, run)["status"] == "dead")
    kinds = [e["type"] for e in events(db, run)]
    assert kinds.count("run_claimed") == 2 and kinds.count("run_requeued") == 1  # one retry, then dead
    assert kinds.count("complete") == 1
    assert "failing on purpose" in run_row(db, run)["error"]


def heartbeat_tasks() -> int:
    return sum(
        1 for t in asyncio.all_tasks() if not t.done() and t.get_coro().__qualname__ == "heartbeat_loop"
    )


async def test_a_run_has_no_heartbeat_task_until_its_first_beat_is_due(worker_db, pool, db) -> None:
    """The first beat is due a third of a lease after the claim: until then a timer waits, not
    a task, so a run that ends sooner (most short runs) costs no heartbeat task. A longer run
    beats on time: the lease is extended and last_heartbeat_at moves past the claim."""
    seen: dict[str, list[int]] = {}

    async def probe(ctx: RunContext) -> Outcome:
        name = str(ctx.run.metadata["name"])
        seen[name] = [heartbeat_tasks()]
        await asyncio.sleep(float(ctx.run.metadata["wait"]))
        seen[name].append(heartbeat_tasks())
        return Outcome("completed", result={"text": ""})

    writer = JournalWriter(pool)
    await writer.start()
    d = Dispatcher(
        pool=pool,
        hub=None,
        writer=writer,
        handler=probe,
        concurrency=1,
        lease_seconds=6,  # the first beat is due 2 s after the claim: a margin for a busy box
        poll_seconds=0.1,
        worker_id="in-process",
    )
    await d.start()
    try:
        short = enqueue_echo(db, "short", name="short", wait=0.2)
        await wait_until_async(lambda: run_row(db, short)["status"] == "completed")
        long = enqueue_echo(db, "long", name="long", wait=3.0)
        await wait_until_async(lambda: run_row(db, long)["status"] == "completed")
    finally:
        await d.stop_claiming()
        await asyncio.gather(*d.tasks(), return_exceptions=True)
        await writer.stop()
    assert seen == {"short": [0, 0], "long": [0, 1]}
    beat = db.execute(
        "SELECT last_heartbeat_at > started_at FROM runrow.agent_run WHERE id = %s", (long,)
    ).fetchone()[0]
    assert beat, "the long run beat at a third of its lease"
