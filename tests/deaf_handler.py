"""A run handler for tests/test_worker_drain.py that ignores every interrupt: each cancellation
of its task is swallowed and it goes on waiting, as a library stuck in a loop that catches
everything does (loaded by a worker process with tests/ on PYTHONPATH)."""

from __future__ import annotations

import asyncio

from pyworker.worker.handler import Outcome, RunContext


async def handle(ctx: RunContext) -> Outcome:
    await ctx.journal.emit({"type": "text_delta", "index": 0, "text": "working"})
    while True:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ctx.log.info("deaf: an interrupt is ignored")
