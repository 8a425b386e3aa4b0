"""The dispatcher books runs in flight by claim, not by run: while a stale attempt of a run
stands down, a new claim of the same run may already be running in the same process. A cancel
NOTIFY (which names only the run) makes both beat: the stale attempt stands down writing nothing
and leaves the new one in flight (the drain waits for it), which its row cancels."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

import pytest
from psycopg_pool import AsyncConnectionPool
from worker_support import db, in_process_dispatcher, pool, run_row, wait_until_async, worker_db

from pyworker.db import api
from pyworker.db.hub import Hub
from pyworker.worker.handler import Outcome, RunContext
from pyworker.worker.journal import JournalWriter

__all__ = ["db", "pool", "worker_db"]

# No heartbeat fires during the test (every lease/3 = 20 min): a cancel can only come by NOTIFY.
LEASE = 3600


async def test_cancel_reaches_every_claim_and_a_stale_ending_keeps_the_new_claim(
    worker_db: str, pool: AsyncConnectionPool, db, caplog
) -> None:
    seen: dict[int, RunContext] = {}
    gates = {1: asyncio.Event(), 2: asyncio.Event()}

    async def handler(ctx: RunContext) -> Outcome:
        seen[ctx.run.attempt] = ctx
        await gates[ctx.run.attempt].wait()
        return Outcome("cancelled" if ctx.cancel.is_set() else "completed", result={"text": ""})

    hub = Hub(worker_db)
    await hub.start()
    assert await hub.wait_connected(5)
    writer = JournalWriter(pool)
    await writer.start()
    d = in_process_dispatcher(
        pool, writer, handler, "in-process", concurrency=2, lease_seconds=LEASE, hub=hub
    )
    watcher = asyncio.create_task(d.watch_cancels())
    try:
        await asyncio.sleep(0.05)  # let the cancel watcher subscribe
        async with pool.connection() as conn:
            run = (await api.enqueue_run(conn, uuid.uuid4(), "hi", "echo", max_attempts=2)).run_id
        await d.start()
        await wait_until_async(lambda: 1 in seen, what="attempt 1 to start")
        async with pool.connection() as conn:  # attempt 1's claim is taken away, as a reap would
            assert await api.release_run(conn, run, seen[1].run.claim_token, "reaped") == "requeued"
        await wait_until_async(lambda: 2 in seen, what="the same dispatcher to claim attempt 2")
        assert len(d.tasks()) == 2

        assert db.execute("SELECT runrow.cancel_run(run_id => %s)", (run,)).fetchone() == (
            "cancel_requested",
        )
        # The NOTIFY names only the run: both claims beat at once. The stale one learns it lost
        # the run and stands down, writing nothing; the new one is cancelled by its row.
        await wait_until_async(lambda: seen[2].cancel.is_set(), what="the cancel to reach attempt 2")
        await wait_until_async(lambda: len(d.tasks()) < 2, what="attempt 1 to stand down")
        assert not seen[1].cancel.is_set() and seen[1].lost.is_set()
        assert "heartbeat: the run is no longer ours" in caplog.text
        assert len(d.tasks()) == 1  # attempt 2 is still in flight
        assert run_row(db, run)["status"] == "running"

        gates[2].set()
        await wait_until_async(lambda: run_row(db, run)["status"] == "cancelled", what="attempt 2 to end")
        assert run_row(db, run)["attempt"] == 2
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # a right fence
    finally:
        for gate in gates.values():
            gate.set()
        await d.stop_claiming()
        await asyncio.gather(*d.tasks(), return_exceptions=True)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await writer.stop()
        await hub.stop()


@pytest.fixture(autouse=True)
def _info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
