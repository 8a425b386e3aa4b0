"""The handler and the ending run in the supervisor's own task (pyworker/worker/supervisor.py),
so the supervisor stops them by cancelling that task and taking the cancellation back: a run
lost or abandoned while its handler waits ends at once, and the task is left with no
cancellation pending (its next await would raise it, wherever that is); a cancellation from
anyone else still ends the supervisor. Real claims on a real database; the handlers wait on
events the test sets, so every interleaving here is exact."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator

import pytest
from psycopg_pool import AsyncConnectionPool
from worker_support import db, pool, run_row, worker_db

from pyworker.db import api
from pyworker.db.api import ClaimedRun
from pyworker.worker.handler import Outcome, RunContext, RunHandler
from pyworker.worker.journal import JournalWriter
from pyworker.worker.supervisor import RunSupervisor, _what_next

__all__ = ["db", "pool", "worker_db"]


@pytest.fixture
async def writer(pool: AsyncConnectionPool) -> AsyncIterator[JournalWriter]:
    w = JournalWriter(pool, interval=3600.0)
    await w.start()
    yield w
    await w.stop()


async def claimed(pool: AsyncConnectionPool) -> ClaimedRun:
    async with pool.connection() as conn:
        await api.enqueue_run(conn, uuid.uuid4(), "hi", "echo", max_attempts=3)
        run = await api.claim_run(conn, "interrupt-test", 60)
    assert run is not None
    return run


async def supervisor(pool: AsyncConnectionPool, writer: JournalWriter, handler: RunHandler) -> RunSupervisor:
    run = await claimed(pool)
    return RunSupervisor(run, pool=pool, writer=writer, handler=handler, lease_seconds=60, worker_id="t")


def waiting_handler(started: asyncio.Event, *, swallow: str | None = None) -> RunHandler:
    """A handler that sets `started` and then waits for ever: only a cancellation ends it. With
    `swallow` it catches that cancellation, as a handler should not but one may, and returns a
    completed outcome whose text is `swallow`."""

    async def handler(ctx: RunContext) -> Outcome:
        started.set()
        try:
            await asyncio.Event().wait()  # never set
        except asyncio.CancelledError:
            if swallow is None:
                raise
        return Outcome("completed", result={"text": swallow})

    return handler


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_the_handler_runs_in_the_supervisors_task(pool, writer, db) -> None:  # type: ignore[no-untyped-def]
    seen: list[asyncio.Task[object] | None] = []

    async def handler(ctx: RunContext) -> Outcome:
        seen.append(asyncio.current_task())
        return Outcome("completed", result={"text": ""})

    sup = await supervisor(pool, writer, handler)
    task = asyncio.create_task(sup.supervise())
    assert await task == "completed"
    assert seen == [task]  # no task of its own: the per-run cost this layout saves
    assert run_row(db, sup.run.run_id)["status"] == "completed"


async def test_a_run_lost_while_its_handler_waits_ends_at_once(pool, writer, db) -> None:  # type: ignore[no-untyped-def]
    waiting, after = asyncio.Event(), []
    sup = await supervisor(pool, writer, waiting_handler(waiting))

    async def supervise_then_await() -> str | None:
        ending = await sup.supervise()
        await asyncio.sleep(0)  # a cancellation left pending would be raised here
        after.append(asyncio.current_task().cancelling())  # type: ignore[union-attr]
        return ending

    task = asyncio.create_task(supervise_then_await())
    await waiting.wait()
    sup.lost.set()
    assert await asyncio.wait_for(task, 5) == "lost"
    assert after == [0]
    assert run_row(db, sup.run.run_id)["status"] == "running"  # nothing written: the run is someone else's


async def test_a_run_lost_by_the_handlers_own_task_ends_at_its_next_await(pool, writer, db) -> None:  # type: ignore[no-untyped-def]
    """The journal's group flush sets `lost` from whichever task leads it, often the run's own:
    the handler is stopped at its next await, not while it is still running."""
    steps: list[str] = []

    async def handler(ctx: RunContext) -> Outcome:
        ctx.lost.set()  # as a fenced-out flush led from this task does
        steps.append("set lost, still running")
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    sup = await supervisor(pool, writer, handler)
    assert await asyncio.wait_for(sup.supervise(), 5) == "lost"
    assert steps == ["set lost, still running"]
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_handler_that_swallows_the_interrupt_still_loses_the_run(pool, writer, db) -> None:  # type: ignore[no-untyped-def]
    waiting = asyncio.Event()
    sup = await supervisor(pool, writer, waiting_handler(waiting, swallow="too late"))
    task = asyncio.create_task(sup.supervise())
    await waiting.wait()
    sup.lost.set()
    assert await asyncio.wait_for(task, 5) == "lost"
    assert run_row(db, sup.run.run_id)["status"] == "running"


async def test_an_abandoned_handler_is_stopped_and_the_run_released(pool, writer, db, caplog) -> None:  # type: ignore[no-untyped-def]
    waiting = asyncio.Event()
    sup = await supervisor(pool, writer, waiting_handler(waiting))
    task = asyncio.create_task(sup.supervise())
    await waiting.wait()
    with caplog.at_level(logging.INFO):
        sup.abandon("drained: test")
        assert await asyncio.wait_for(task, 5) == "released:requeued"
    row = run_row(db, sup.run.run_id)
    assert (row["status"], row["error"]) == ("queued", "drained: test")
    # It said "run released (drained: test, retry in None): requeued".
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("run released")]
    assert said == ["run released (drained: test): requeued, claimable at once"], said


@pytest.mark.parametrize(
    ("result", "retry_in", "said"),
    [
        ("requeued", None, "requeued, claimable at once"),
        ("requeued", 2.5, "requeued, claimable in 2.5 s"),
        ("failed", None, "failed"),
        ("dead", 30.0, "dead"),
        ("deferred", 0.25, "deferred, claimable within 0.25 s"),
    ],
)
def test_a_release_says_what_comes_next_without_a_none(
    result: str, retry_in: float | None, said: str
) -> None:
    assert _what_next(result, retry_in) == said


async def test_abandoning_a_run_whose_ending_is_in_flight_keeps_the_ending(pool, writer, db) -> None:  # type: ignore[no-untyped-def]
    """The drain abandons what is still in flight; a run already ending is not interrupted."""

    async def handler(ctx: RunContext) -> Outcome:
        return Outcome("completed", result={"text": "done"})

    sup = await supervisor(pool, writer, handler)
    task = asyncio.create_task(sup.supervise())
    for _ in range(50):
        if sup._in == "ending":
            break
        await asyncio.sleep(0)
    assert sup._in == "ending"
    sup.abandon("drained: test")
    assert await asyncio.wait_for(task, 5) == "completed"
    assert run_row(db, sup.run.run_id)["status"] == "completed"


async def test_a_cancellation_from_outside_ends_the_supervisor(pool, writer, db) -> None:  # type: ignore[no-untyped-def]
    """The drain cancels supervisors still stuck a lease after abandoning them: that stands,
    even on top of the supervisor's own interrupt."""
    waiting = asyncio.Event()

    async def handler(ctx: RunContext) -> Outcome:
        waiting.set()
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling() > 1:  # type: ignore[union-attr]
                    raise
                # stuck: ignores the supervisor's own interrupt

    sup = await supervisor(pool, writer, handler)
    task = asyncio.create_task(sup.supervise())
    await waiting.wait()
    sup.abandon("drained: test")
    await turns()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert task.cancelled()


async def test_an_outside_cancellation_the_handler_swallows_still_ends_the_supervisor(
    pool, writer, db
) -> None:  # type: ignore[no-untyped-def]
    """Before, such a cancellation reached the supervisor's own wait, never the handler: it must
    not be lost now that it passes through the handler."""
    waiting = asyncio.Event()
    sup = await supervisor(pool, writer, waiting_handler(waiting, swallow="swallowed"))
    task = asyncio.create_task(sup.supervise())
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert task.cancelled()
    assert run_row(db, sup.run.run_id)["status"] == "running"  # nothing written for the swallowed outcome
