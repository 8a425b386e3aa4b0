"""The reaper: a loop in every worker (no singleton to lose) plus one pass at boot.

reap_expired_runs is safe to run on every worker at once and re-checks liveness in its own
write, so the loop only decides when to ask. The interval is jittered so a fleet started
together does not sweep in lockstep. The boot pass clears what a full-cluster outage left.

The same loop trims the live journal of runs terminal for longer than `trim_after` seconds
(runrow.trim_journal; steps, messages and effects stay): the journal is a delivery buffer,
and without this nobody would ever empty it. trim_journal reads only runs it has not trimmed
yet, so asking on every pass costs the same with any amount of history. It deletes the webhook
deliveries delivered that long ago too (at most 10,000 a pass; dead letters stay).

And it fires the schedules (runrow.fire_schedules_pass): every worker asks, each due tick enqueues
once whoever asks first, and a pass skips the schedules another worker is firing instead of
waiting for it, so the fleet needs no scheduler of its own.
"""

from __future__ import annotations

import asyncio
import logging
import random

from psycopg_pool import AsyncConnectionPool

from pyworker.db import api, schedules
from pyworker.worker import metrics

log = logging.getLogger("runrow.reaper")


async def reap_once(
    pool: AsyncConnectionPool, grace_seconds: int, max_runs: int = 100
) -> list[tuple[object, str]]:
    async with pool.connection() as conn:
        reaped = await api.reap_expired_runs(conn, grace_seconds, max_runs)
    for run_id, outcome in reaped:
        log.warning("reaped run %s: %s", run_id, outcome, extra={"run_id": str(run_id)})
    metrics.reaped(outcome for _, outcome in reaped)
    return list(reaped)


async def trim_once(pool: AsyncConnectionPool, older_than_seconds: float) -> int:
    async with pool.connection() as conn:
        trimmed = await api.trim_journal(conn, older_than_seconds)
    if trimmed:
        log.info(
            "trimmed %d rows: journals of runs ended, and webhooks delivered, more than %.0f s ago",
            trimmed,
            older_than_seconds,
        )
    return trimmed


# A pass takes at most this many schedules (fire_schedules' max_schedules), in one transaction, and
# at most 64 ticks whatever this says (each is a subtransaction: the function's own cap).
FIRE_BATCH = 100
# Passes in a row while they keep enqueueing: more schedules due at once than one pass takes
# were left to the next reaper interval, so a minute's tick of the 101st and later ran up to an
# interval late, and with catch_up latest a tick was skipped for good (issue 11's schedule audit).
MAX_FIRE_PASSES = 50


async def fire_once(pool: AsyncConnectionPool) -> int:
    fired = 0
    for _ in range(MAX_FIRE_PASSES):
        async with pool.connection() as conn:
            enqueued, moved_on = await schedules.fire_schedules_pass(conn, FIRE_BATCH)
        fired += enqueued
        # Again while the pass used its budget: FIRE_BATCH schedules moved on (their ticks may
        # all have enqueued nothing: if_active reject on a busy conversation, a failing template,
        # and the schedules behind them waited an interval per FIRE_BATCH of those), or runs
        # enqueued (it may have stopped at its 64 subtransactions). Otherwise nothing due could
        # fire now (what is left is busy, for a later interval).
        if moved_on < FIRE_BATCH and enqueued == 0:
            break
    if fired:
        log.info("schedules: enqueued %d run(s) for due ticks", fired)
    return fired


async def reaper_loop(
    pool: AsyncConnectionPool, *, interval: float, grace_seconds: int, trim_after: float | None = None
) -> None:
    while True:
        try:
            reaped = await reap_once(pool, grace_seconds)
            if len(reaped) == 100:
                continue  # more orphans than one pass takes: go again at once
        except Exception as exc:
            log.warning("reap failed, retrying after the interval: %s", exc)
        # Apart from the reap: a schedule that cannot fire must not stop the reaping, nor the reverse.
        try:
            await fire_once(pool)
        except Exception as exc:
            log.warning("firing schedules failed, retrying after the interval: %s", exc)
        try:
            if trim_after is not None:
                await trim_once(pool, trim_after)
        except Exception as exc:
            log.warning("trim failed, retrying after the interval: %s", exc)
        await asyncio.sleep(interval * random.uniform(0.5, 1.5))
