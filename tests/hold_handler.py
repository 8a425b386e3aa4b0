"""A run handler for tests/test_metrics.py: holds a connection of the worker's run pool in a
query for HOLD_SECONDS, as a handler whose `ctx.db` call is slow does (loaded by a worker
process with tests/ on PYTHONPATH)."""

from __future__ import annotations

from typing import Any

from pyworker.worker.handler import Outcome, RunContext

HOLD_SECONDS = 30


async def handle(ctx: RunContext) -> Outcome:
    async def hold(conn: Any) -> None:
        await conn.execute(f"SELECT pg_sleep({HOLD_SECONDS})")

    await ctx.db(hold, "hold")
    return Outcome("completed", result={"held": HOLD_SECONDS})
