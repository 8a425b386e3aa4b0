"""A run handler for tests/test_worker_drain.py: its work does not stop at the drain's first
interrupt (the supervisor's own cancellation when the drain budget is spent: a library that
swallows a cancellation does that), only at the drain's last resort, a lease later. Then it
does what the agent does when its task is cancelled mid-stream: it pays for the response it
cut (limits.settle_interrupted: record_usage) and journals what happened (loaded by a worker
process with tests/ on PYTHONPATH)."""

from __future__ import annotations

import asyncio

from pyworker.agent import limits
from pyworker.worker.handler import Outcome, RunContext

USAGE = {"input_tokens": 1234, "output_tokens": 56}


async def handle(ctx: RunContext) -> Outcome:
    await ctx.journal.emit({"type": "text_delta", "index": 0, "text": "working"})
    interrupts = 0
    while True:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            interrupts += 1
            if interrupts < 2:
                ctx.log.info("stuck: the drain's interrupt is ignored")
                continue
            await limits.settle_interrupted(ctx, USAGE)
            await ctx.journal.emit({"type": "interrupted", "interrupts": interrupts})
            raise
