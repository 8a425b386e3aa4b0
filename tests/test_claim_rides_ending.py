"""A journal flush that ends runs claims their successors in the same transaction (the
dispatcher is the writer's rider): one commit per run ended and replaced, not two. The claimed
runs start in the slots the ended ones free; a drain waits for a ride in flight, so its runs
are counted; a COMMIT left unanswered hands its runs over for the fence to say which are ours.

Same transaction is read from the rows themselves: the ended run's finished_at and the
successor's started_at are both the transaction's now(), equal only when the two writes share
it (the claim's rows carry a subtransaction's xmin, so xmin cannot tell)."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from wire_fault_support import faulty_pool, proxy
from worker_support import db, enqueue_echo, in_process_dispatcher, pool, run_row, wait_until_async, worker_db

from pyworker.db import api
from pyworker.worker.dispatcher import Dispatcher
from pyworker.worker.echo import handle as echo
from pyworker.worker.handler import Outcome, RunContext, RunHandler
from pyworker.worker.journal import JournalWriter

__all__ = ["db", "faulty_pool", "pool", "proxy", "worker_db"]

LEASE = 3600  # no heartbeat fires during a test


def one_transaction(db, ended: uuid.UUID, claimed: uuid.UUID) -> bool:  # type: ignore[no-untyped-def]
    """Whether `ended` was finished in the transaction that claimed `claimed` (same now())."""
    return db.execute(
        "SELECT e.finished_at = c.started_at FROM runrow.agent_run AS e, runrow.agent_run AS c"
        " WHERE e.id = %s AND c.id = %s",
        (ended, claimed),
    ).fetchone()[0]


async def enqueue(pool: AsyncConnectionPool, n: int) -> list[uuid.UUID]:
    async with pool.connection() as conn:
        return [(await api.enqueue_run(conn, uuid.uuid4(), f"run {i}", "echo")).run_id for i in range(n)]


def gated(gates: dict[uuid.UUID, asyncio.Event]) -> RunHandler:
    async def handler(ctx: RunContext) -> Outcome:
        await gates[ctx.run.run_id].wait()
        return Outcome("completed", result={"text": ""})

    return handler


async def start(
    pool: AsyncConnectionPool,
    handler: RunHandler,
    concurrency: int,
    writer: JournalWriter | None = None,
    poll_seconds: float = 0.2,
) -> tuple[Dispatcher, JournalWriter]:
    writer = writer or JournalWriter(pool)
    await writer.start()
    d = in_process_dispatcher(
        pool,
        writer,
        handler,
        "rides-test",
        concurrency=concurrency,
        lease_seconds=LEASE,
        poll_seconds=poll_seconds,
    )
    await d.start()
    return d, writer


async def stop(d: Dispatcher, writer: JournalWriter, gates: dict[uuid.UUID, asyncio.Event]) -> None:
    for gate in gates.values():
        gate.set()
    await d.stop_claiming()
    await asyncio.gather(*d.tasks(), return_exceptions=True)
    await writer.stop()


async def test_an_ending_claims_its_successor_in_its_own_transaction(pool: AsyncConnectionPool, db) -> None:
    first, second = await enqueue(pool, 2)
    gates = {first: asyncio.Event(), second: asyncio.Event()}
    d, writer = await start(pool, gated(gates), concurrency=1)
    try:
        await wait_until_async(lambda: run_row(db, first)["status"] == "running", what="the first claim")
        assert run_row(db, second)["status"] == "queued"  # one slot: the second waits
        gates[first].set()
        await wait_until_async(lambda: run_row(db, second)["status"] == "running", what="the successor")
        assert run_row(db, first)["status"] == "completed"
        # The first run's ending and the second's claim are one transaction.
        assert one_transaction(db, first, second)
        # The successor took the ended run's slot: once that one has wound down, one run is in
        # flight and no slot is free, so a run enqueued now waits (the loop polls every 0.2 s).
        await wait_until_async(lambda: len(d.tasks()) == 1, what="the ended run to wind down")
        (third,) = await enqueue(pool, 1)
        gates[third] = asyncio.Event()
        await asyncio.sleep(0.6)
        assert run_row(db, third)["status"] == "queued"
        gates[second].set()
        await wait_until_async(
            lambda: run_row(db, second)["status"] == "completed", what="the successor to end"
        )
        await wait_until_async(
            lambda: run_row(db, third)["status"] == "running", what="the third, in the freed slot"
        )
        assert one_transaction(db, second, third)
        gates[third].set()
        await wait_until_async(lambda: run_row(db, third)["status"] == "completed", what="the third to end")
        assert (d.claimed, d.claims) == (3, 3)
    finally:
        await stop(d, writer, gates)


async def test_an_ending_flushed_with_another_runs_events_claims_in_that_transaction(
    pool: AsyncConnectionPool, db
) -> None:
    """A flush that also writes another run's buffered deltas is a transaction of several
    statements; the claim rides it too, after finish_runs, before the COMMIT."""
    streaming, ending, waiting = await enqueue(pool, 3)
    gates = {run: asyncio.Event() for run in (streaming, ending, waiting)}
    delta = asyncio.Event()

    async def handler(ctx: RunContext) -> Outcome:
        if ctx.run.run_id == streaming:  # a delta left in the buffer (the clock never ticks)
            await ctx.journal.emit({"type": "text_delta", "index": 0, "text": "x"})
            delta.set()
        await gates[ctx.run.run_id].wait()
        return Outcome("completed", result={"text": ""})

    writer = JournalWriter(pool, interval=3600)
    d, writer = await start(pool, handler, concurrency=2, writer=writer)
    try:
        await wait_until_async(
            lambda: delta.is_set() and run_row(db, ending)["status"] == "running", what="two runs in flight"
        )
        gates[ending].set()
        await wait_until_async(lambda: run_row(db, waiting)["status"] == "running", what="the successor")
        assert one_transaction(db, ending, waiting)
        kinds = db.execute(
            "SELECT array_agg(type ORDER BY seq) FROM runrow.run_event WHERE run_id = %s", (streaming,)
        ).fetchone()[0]
        assert kinds[-1] == "text_delta"  # written by that same flush
    finally:
        await stop(d, writer, gates)


async def test_an_ending_claims_nothing_when_the_last_claim_found_the_queue_short(
    pool: AsyncConnectionPool, db
) -> None:
    """Two slots, one run: the claim came back short, so the queue looked empty, and the loop
    waits for a wake (none comes: no hub, and its poll tick is an hour). A run enqueued
    meanwhile is not claimed by the ending of the first; a ride would have claimed it."""
    (first,) = await enqueue(pool, 1)
    gates = {first: asyncio.Event()}
    d, writer = await start(pool, gated(gates), concurrency=2, poll_seconds=3600)
    try:
        await wait_until_async(lambda: run_row(db, first)["status"] == "running", what="the claim")
        (second,) = await enqueue(pool, 1)
        gates[second] = asyncio.Event()
        gates[first].set()
        await wait_until_async(lambda: run_row(db, first)["status"] == "completed", what="the ending")
        await asyncio.sleep(0.3)  # a ride's claim commits with the ending: nothing to wait for
        assert run_row(db, second)["status"] == "queued"
        assert d.claims == 1
    finally:
        await stop(d, writer, gates)


async def test_a_drain_waits_for_a_claim_riding_an_ending(
    pool: AsyncConnectionPool, db, worker_db: str
) -> None:
    first, second = await enqueue(pool, 2)
    gates = {first: asyncio.Event(), second: asyncio.Event()}
    d, writer = await start(pool, gated(gates), concurrency=1)
    try:
        await wait_until_async(lambda: run_row(db, first)["status"] == "running", what="the first claim")
        with psycopg.connect(worker_db) as blocker:
            # The first run's row locked: its ending's flush (and the claim riding it) waits.
            blocker.execute("SELECT 1 FROM runrow.agent_run WHERE id = %s FOR UPDATE", (first,))
            gates[first].set()
            await wait_until_async(
                lambda: (
                    db.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND query LIKE '%%finish_and_claim_runs%%'"
                    ).fetchone()[0]
                    == 1
                ),
                what="the ending's flush to wait on the row lock",
            )
            stopping = asyncio.create_task(d.stop_claiming())
            await asyncio.sleep(0.3)
            assert not stopping.done(), "the drain did not wait for the claim riding the ending"
            blocker.rollback()
        await asyncio.wait_for(stopping, 10)
        # The ride's run is in hand before the drain counts what to wait for.
        assert run_row(db, second)["status"] == "running"
        assert [sup.run.run_id for sup in d.supervisors(second)] == [second]
        gates[second].set()
        await asyncio.wait_for(asyncio.gather(*d.tasks()), 10)
        assert [run_row(db, r)["status"] for r in (first, second)] == ["completed", "completed"]
    finally:
        await stop(d, writer, gates)


async def test_runs_claimed_by_an_ending_whose_commit_went_unanswered_are_read_back(
    faulty_pool: AsyncConnectionPool, pool: AsyncConnectionPool, proxy, db, caplog: pytest.LogCaptureFixture
) -> None:
    first = enqueue_echo(db, "first", duration=0, max_attempts=1)
    second = enqueue_echo(db, "second", duration=0, max_attempts=1)
    proxy.break_at(b"COMMIT", deliver=True)  # the first ending's, with the second's claim
    # Only the journal's transactions pass the proxy; the claims and read-backs do not.
    d, writer = await start(pool, echo, concurrency=1, writer=JournalWriter(faulty_pool))
    try:
        # An orphaned claim would sit running for its lease (an hour here).
        await wait_until_async(
            lambda: [run_row(db, r)["status"] for r in (first, second)] == ["completed", "completed"],
            within=20,
            what="both runs to end",
        )
    finally:
        await stop(d, writer, {})
    assert proxy.fired == ["COMMIT delivered"]
    assert one_transaction(db, first, second)
    for run in (first, second):
        row = run_row(db, run)
        assert (row["status"], row["attempt"]) == ("completed", 1)
    assert "claim in doubt: 1 of 1 run(s) had been claimed" in caplog.text


@pytest.fixture(autouse=True)
def _info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
