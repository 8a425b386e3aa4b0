"""The reaper: a loop in every worker (no singleton to lose) plus one pass at boot.

reap_expired_runs is safe to run on every worker at once and re-checks liveness in its own
write, so the loop only decides when to ask. The interval is jittered so a fleet started
together does not sweep in lockstep. The boot pass clears what a full-cluster outage left.
"""

from __future__ import annotations

import asyncio
import logging
import random

from psycopg_pool import AsyncConnectionPool

from pyworker import api

log = logging.getLogger("runrow.reaper")


async def reap_once(
    pool: AsyncConnectionPool, grace_seconds: int, max_runs: int = 100
) -> list[tuple[object, str]]:
    async with pool.connection() as conn:
        reaped = await api.reap_expired_runs(conn, grace_seconds, max_runs)
    for run_id, outcome in reaped:
        log.warning("reaped run %s: %s", run_id, outcome, extra={"run_id": str(run_id)})
    return list(reaped)


async def reaper_loop(pool: AsyncConnectionPool, *, interval: float, grace_seconds: int) -> None:
    while True:
        try:
            reaped = await reap_once(pool, grace_seconds)
            if len(reaped) == 100:
                continue  # more orphans than one pass takes: go again at once
        except Exception as exc:
            log.warning("reap failed, retrying after the interval: %s", exc)
        await asyncio.sleep(interval * random.uniform(0.5, 1.5))
