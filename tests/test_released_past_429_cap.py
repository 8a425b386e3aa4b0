"""api.released_past_429_cap against what defer_run really stores.

A worker whose deferral's answer was lost asks whether its first COMMIT landed
(supervisor._ended_by_us). Past the run's cap on deferrals for 429s, defer_run releases the run
instead and stores the reason with a suffix of its own (migration 0103: its first 9900
characters, then " (after N deferrals for 429s, ...)"); released_past_429_cap recognises that
text by a copy of its format. Here defer_run is called for real, four times, through
api.defer_run as the worker calls it, and each stored error is fed to released_past_429_cap: a
change to either side's format fails this test rather than turn a landed release into "lost".
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import psycopg
import pytest
from race_support import database_url, owner

from pyworker.db import api
from pyworker.db.api import ClaimedRun

__all__ = ["database_url", "owner"]  # the fixtures, re-exported for pytest

REASONS = {
    "short": "429_cap: rate limited 6 times in one attempt",
    # Past release_run's 10000 characters (api cuts it, "…" last) and past defer_run's 9900 cut,
    # in characters of two bytes: the cuts count characters, not bytes.
    "long": "429_cap: " + "é" * 12000,
    "nul": "429_cap: a\x00b",  # a NUL reads as U+FFFD in a text column
}


async def claim_when_due(conn: psycopg.AsyncConnection, within: float = 20) -> ClaimedRun:
    """The run, once due (a deferral of 1 ms makes it due at once)."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        run = await api.claim_run(conn, "cap-test", 60)
        if run is not None:
            return run
        assert asyncio.get_running_loop().time() < deadline, "the run never came due"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("reason", list(REASONS.values()), ids=list(REASONS))
async def test_the_release_past_the_cap_is_recognised_by_the_error_defer_run_stored(
    database_url: str, owner: psycopg.Connection, reason: str
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await api.enqueue_run(conn, uuid.uuid4(), "hi", "echo", max_attempts=3)
        answers, recognised = [], []
        for _ in range(4):
            run = await claim_when_due(conn)
            answers.append(
                await api.defer_run(conn, run.run_id, run.claim_token, timedelta(milliseconds=1), reason)
            )
            stored = (await api.get_run(conn, run.run_id)).error
            recognised.append(api.released_past_429_cap(reason, stored))
    # Three deferrals (their error the reason as sent), then the release past the cap.
    assert answers == ["deferred", "deferred", "deferred", "requeued"]
    assert recognised == [False, False, False, True], stored
    assert not api.released_past_429_cap("429_cap: another reason", stored)
