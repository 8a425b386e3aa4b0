"""A failure that would recur identically ends the run once; a transient one is released.

A real Dispatcher claims and re-claims (the attempts policy in SQL decides), so a handler that
is called again is an attempt that would have paid the model again. The refusals are real
database errors raised by the run's own data; the transient ones are what psycopg raises for a
serialization failure and a lost connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from worker_support import db, enqueue_echo, events, pool, run_row, wait_until_async, worker_db

from pyworker.worker.dispatcher import Dispatcher
from pyworker.worker.failures import DeterministicFailure, deterministic
from pyworker.worker.handler import Outcome, RunContext
from pyworker.worker.journal import JournalError, JournalWriter

__all__ = ["db", "pool", "worker_db"]

calls: list[int] = []  # the attempt of every handler call


async def refused_by_the_database(ctx: RunContext) -> Outcome:
    calls.append(ctx.run.attempt)
    async with ctx.pool.connection() as conn:
        # The run's own data, refused the same way on every attempt (22P05).
        await conn.execute("SELECT %s::text::jsonb", ('{"text": "a\\u0000b"}',))
    return Outcome("completed")


async def journal_rejects(ctx: RunContext) -> Outcome:
    calls.append(ctx.run.attempt)
    await ctx.journal.emit({"type": "text_delta", "index": 0, "text": "a\ud800b"})  # a lone surrogate
    await ctx.journal.flush()
    return Outcome("completed")


async def says_so(ctx: RunContext) -> Outcome:
    calls.append(ctx.run.attempt)
    raise DeterministicFailure("the input names a file that does not exist")


async def serialization_failure(ctx: RunContext) -> Outcome:
    calls.append(ctx.run.attempt)
    raise psycopg.errors.SerializationFailure("could not serialize access")


async def connection_lost(ctx: RunContext) -> Outcome:
    calls.append(ctx.run.attempt)
    raise psycopg.OperationalError("server closed the connection unexpectedly")


async def oversized_result(ctx: RunContext) -> Outcome:
    calls.append(ctx.run.attempt)
    return Outcome("completed", result={"text": "x" * (1024 * 1024 + 1)})  # finish_run's limit is 1 MiB


async def unreadable_result(ctx: RunContext) -> Outcome:
    calls.append(ctx.run.attempt)
    deep: Any = "x"
    for _ in range(150):
        deep = [deep]
    # A result JSON clients cannot read back (migration 0069): its webhook and GET /runs/{id}
    # carry it, and the sender could not decode one nested 3,000 deep.
    return Outcome("completed", result={"text": "x", "deep": deep})


@pytest.fixture
async def start(pool: AsyncConnectionPool) -> AsyncIterator[Callable[..., Any]]:
    calls.clear()
    writer = JournalWriter(pool)
    await writer.start()
    dispatchers: list[Dispatcher] = []

    async def _start(handler: Any) -> Dispatcher:
        d = Dispatcher(
            pool=pool,
            hub=None,
            writer=writer,
            handler=handler,
            concurrency=1,
            lease_seconds=5,
            poll_seconds=0.1,
            worker_id="deterministic",
        )
        await d.start()
        dispatchers.append(d)
        return d

    yield _start
    for d in dispatchers:
        await d.stop_claiming()
        for sup, _ in d.in_flight.values():
            sup.abandon("test over")
        await asyncio.gather(*d.tasks(), return_exceptions=True)
    with contextlib.suppress(Exception):
        await writer.stop()


async def ended(db: psycopg.Connection, run: Any) -> dict[str, Any]:
    await wait_until_async(lambda: run_row(db, run)["status"] in ("failed", "dead", "completed"), 20)
    return run_row(db, run)


@pytest.mark.parametrize(
    ("handler", "says"),
    [
        (refused_by_the_database, "SQLSTATE 22P05"),
        (journal_rejects, "the journal refused this run's events"),
        (says_so, "the input names a file that does not exist"),
        (oversized_result, "completed outcome could not be stored"),
        (unreadable_result, "result nests 100 levels deep or more"),
    ],
)
async def test_a_refusal_that_would_recur_fails_the_run_after_one_attempt(start, db, handler, says) -> None:
    await start(handler)
    run = enqueue_echo(db, "x", max_attempts=3)
    row = await ended(db, run)
    assert (row["status"], row["attempt"], calls) == ("failed", 1, [1]), row
    assert says in row["error"], row["error"]
    kinds = [e["type"] for e in events(db, run)]
    assert kinds.count("run_claimed") == 1 and "run_requeued" not in kinds and kinds[-1] == "complete"


@pytest.mark.parametrize("handler", [serialization_failure, connection_lost])
async def test_a_transient_failure_is_still_released_to_the_attempts_policy(start, db, handler) -> None:
    await start(handler)
    run = enqueue_echo(db, "x", max_attempts=2)
    row = await ended(db, run)
    assert (row["status"], calls) == ("dead", [1, 2]), row
    kinds = [e["type"] for e in events(db, run)]
    assert kinds.count("run_claimed") == 2 and kinds.count("run_requeued") == 1


def test_classification_follows_explicit_causes_only(db: psycopg.Connection) -> None:
    with pytest.raises(psycopg.DataError) as refused:
        db.execute("SELECT 1 / 0")
    assert "22012" in (deterministic(refused.value) or "")
    wrapped = JournalError("journal of run x rejected events")
    wrapped.__cause__ = refused.value
    assert deterministic(wrapped) is not None
    transient = JournalError("journal flush failed")
    transient.__cause__ = psycopg.OperationalError("connection lost")
    assert deterministic(transient) is None
    # Raised while handling a refusal (context, not cause): judged on its own.
    try:
        try:
            raise refused.value
        except psycopg.DataError:
            raise psycopg.OperationalError("connection lost while rolling back") from None
    except psycopg.OperationalError as exc:
        assert deterministic(exc) is None
