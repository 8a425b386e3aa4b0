"""A run handler for tests/test_worker_drain.py that ignores every interrupt: each cancellation
of its task is swallowed and it goes on waiting, as a library stuck in a loop that catches
everything does (loaded by a worker process with tests/ on PYTHONPATH). With DEAF_ATEXIT_FILE set,
it registers an exit handler that writes that file, as the tracer provider registers the flush of
its batched spans: whether the worker's exit runs them."""

from __future__ import annotations

import asyncio
import atexit
import os
from pathlib import Path

from pyworker.worker.handler import Outcome, RunContext

if os.environ.get("DEAF_ATEXIT_FILE"):
    atexit.register(Path(os.environ["DEAF_ATEXIT_FILE"]).write_text, "exit handlers ran")


async def handle(ctx: RunContext) -> Outcome:
    await ctx.journal.emit({"type": "text_delta", "index": 0, "text": "working"})
    while True:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ctx.log.info("deaf: an interrupt is ignored")
