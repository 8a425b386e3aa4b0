"""What a worker does when the database fences out its run's ending.

Usually someone else took the run (a reaper, a stop, a newer claim): the worker writes nothing
more and says what the run is now. But a fence can also be wrong: stop 38 found
finish_and_claim_runs losing an ending whose claim still held the run (its recheck of a row a
heartbeat had just updated), and the run then stayed running until the reaper failed it at the
lease's end. The worker now asks with a heartbeat: still owned means the database erred, so it
says so at ERROR and releases the run at once (requeued while attempts are left), or, for a
deterministic failure, ends it failed once more (it must not be tried again).

A wrong fence is made here with the real SQL: the first ending is sent with a token that is not
the claim's, so finish_runs fences it out and leaves the run running under the real token. A
right fence (a newer claim holds the run) is tests/test_dispatcher_claims.py's stale attempt.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import replace
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool
from worker_support import db, in_process_dispatcher, pool, run_row, wait_until_async, worker_db

from pyworker.db import api
from pyworker.worker import journal as journal_module
from pyworker.worker.failures import DeterministicFailure
from pyworker.worker.handler import Outcome, RunContext
from pyworker.worker.journal import JournalWriter

__all__ = ["db", "pool", "worker_db"]

LEASE = 3600  # no heartbeat of its own fires during the test: only the probe beats


async def _drain(dispatcher: Any) -> None:
    await dispatcher.stop_claiming()
    await asyncio.gather(*dispatcher.tasks(), return_exceptions=True)


def forge_first_ending(monkeypatch: pytest.MonkeyPatch) -> list[uuid.UUID]:
    """The first ending the writer sends carries a token the database never gave; the runs it
    was for, once sent."""
    real_ack = journal_module._ack
    forged: list[uuid.UUID] = []

    def first_ack_forged(unit: Any, events: list[dict[str, Any]]) -> Any:
        ack = real_ack(unit, events)
        if forged:
            return ack
        forged.append(ack.run_id)
        return replace(ack, claim_token=uuid.uuid4())

    monkeypatch.setattr(journal_module, "_ack", first_ack_forged)
    return forged


async def drain_forged_run(  # type: ignore[no-untyped-def]
    pool: AsyncConnectionPool,
    db,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    handler: Any,
    status: str,
) -> uuid.UUID:
    """One run (two attempts allowed) through an in-process dispatcher until it is `status`,
    its first ending sent with a forged token (forge_first_ending) and the worker's INFO lines
    captured."""
    forged = forge_first_ending(monkeypatch)
    caplog.set_level(logging.INFO, logger="runrow")
    run = await drain_one_run(pool, db, handler, status)
    assert forged == [run]
    return run


async def drain_one_run(pool: AsyncConnectionPool, db, handler: Any, status: str) -> uuid.UUID:  # type: ignore[no-untyped-def]
    """One run (two attempts allowed) through an in-process dispatcher until it is `status`."""
    writer = JournalWriter(pool)
    await writer.start()
    d = in_process_dispatcher(pool, writer, handler, "in-process", concurrency=1, lease_seconds=LEASE)
    try:
        async with pool.connection() as conn:
            run = (await api.enqueue_run(conn, uuid.uuid4(), "hi", "echo", max_attempts=2)).run_id
        await d.start()
        await wait_until_async(lambda: run_row(db, run)["status"] == status, what=f"the run to be {status}")
    finally:
        await _drain(d)
        await writer.stop()
    return run


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_an_ending_fenced_out_while_the_claim_holds_the_run_releases_it(
    worker_db: str, pool: AsyncConnectionPool, db, caplog: pytest.LogCaptureFixture, monkeypatch
) -> None:
    attempts: list[int] = []

    async def handler(ctx: RunContext) -> Outcome:
        attempts.append(ctx.run.attempt)
        return Outcome("completed", result={"text": f"attempt {ctx.run.attempt}"})

    run = await drain_forged_run(pool, db, monkeypatch, caplog, handler, "completed")

    assert attempts == [1, 2]  # released at once after the wrong fence, then claimed again
    row = run_row(db, run)
    assert (row["attempt"], row["result"]) == (2, {"text": "attempt 2"})
    assert errors(caplog) == ["finish_run fenced out, yet this claim still holds the run; releasing it"]
    assert "run released (finish_run was fenced out while this claim held the run" in caplog.text


async def test_a_deterministic_failure_fenced_out_wrongly_is_ended_failed_again_not_retried(
    worker_db: str, pool: AsyncConnectionPool, db, caplog: pytest.LogCaptureFixture, monkeypatch
) -> None:
    attempts: list[int] = []

    async def handler(ctx: RunContext) -> Outcome:
        attempts.append(ctx.run.attempt)
        raise DeterministicFailure("the request is malformed")

    run = await drain_forged_run(pool, db, monkeypatch, caplog, handler, "failed")

    assert attempts == [1]  # a second attempt would fail the same way
    row = run_row(db, run)
    assert (row["attempt"], row["error"]) == (1, "the request is malformed")
    assert (
        errors(caplog)[-1]
        == "finish_run fenced out, yet this claim still holds the run; ending it failed again"
    )
