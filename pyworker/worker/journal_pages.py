"""A run's whole journal, read page by page through read_events: what a resumed attempt walks
(supersede.py). The agent's 429 cap walked it too until defer_run kept the count (0103), and a
resumed run's or a fork's ending until the step kept it (0108)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pyworker.db import api
from pyworker.worker.handler import RunContext

PAGE = 10000  # read_events' own page limit


async def run_journal(ctx: RunContext) -> AsyncIterator[Any]:
    """The events of ctx's run in seq order, from its first."""
    run = ctx.run.run_id
    cursor = 0
    while True:
        events = await ctx.db(
            lambda conn, after=cursor: api.read_events(conn, run, after, PAGE), "journal read"
        )
        for event in events:
            yield event
        if len(events) < PAGE:
            return
        cursor = events[-1].seq
