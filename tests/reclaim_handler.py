"""A run handler for tests/test_worker_reclaim.py: the echo handler, except that an attempt
that loses its claim lets go only once the next attempt of the same run is claimed and has
journaled its first event (loaded by a worker process with tests/ on PYTHONPATH).

That is the interleaving of a paused worker that, resumed, re-claims its own run before its
stale attempt has finished standing down (a real handler's cleanup, say closing a model
stream, takes that long); forcing it makes the stale attempt's cleanup land on the new one.
"""

from __future__ import annotations

import asyncio

from pyworker.db import api
from pyworker.worker import echo
from pyworker.worker.handler import Outcome, RunContext
from pyworker.worker.journal import RunLost

POLL_SECONDS = 0.05


async def handle(ctx: RunContext) -> Outcome:
    try:
        return await echo.handle(ctx)
    except (asyncio.CancelledError, RunLost):
        if ctx.lost.is_set():
            await _until_next_attempt_journals(ctx)
        raise


async def _until_next_attempt_journals(ctx: RunContext) -> None:
    """Outlast the supervisor's cancellation (it awaits us) until a later attempt has written an
    event after its run_claimed: by then its supervisor and journal exist in this process."""
    ctx.log.info("reclaim handler: lost; waiting for the next attempt to journal")
    while True:
        try:
            async with ctx.pool.connection() as conn:
                events = await api.read_events(conn, ctx.run.run_id, 0, 10000)
            claimed = [
                e.seq for e in events if e.type == "run_claimed" and e.payload["attempt"] > ctx.run.attempt
            ]
            if claimed and any(e.seq > claimed[-1] for e in events):
                ctx.log.info("reclaim handler: the next attempt is journaling; letting go")
                return
            await asyncio.sleep(POLL_SECONDS)
        except asyncio.CancelledError:
            continue
