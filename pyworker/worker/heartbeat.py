"""The per-run heartbeat: extends the lease at a third of it, and doubles as the cancel poll.

`owned = false` sets `lost` (the supervisor aborts the run's work at once and writes nothing);
`cancel_requested = true` sets `cancel` (the fallback for a missed NOTIFY on runrow_cancel).
A beat that meets a transient database error (a restart, a failover) is made again at once on
a fresh connection (pyworker/db/retry.py) rather than at the next beat: the lease keeps running
on the database clock. After about a lease without a database the run is given up quietly
(`lost`: stop working, write nothing; a reaper takes it once the database is back). Any other
failure is retried at the next beat: if the lease lapses meanwhile the reaper takes the run and
the next heartbeat that gets through says owned = false.
"""

from __future__ import annotations

import asyncio
import logging

from psycopg_pool import AsyncConnectionPool

from pyworker.db import api
from pyworker.db.aio import wait_event
from pyworker.db.api import ClaimedRun
from pyworker.db.retry import DatabaseUnavailable, Retry
from pyworker.worker import metrics


async def heartbeat_loop(
    pool: AsyncConnectionPool,
    run: ClaimedRun,
    lease_seconds: int,
    *,
    cancel: asyncio.Event,
    lost: asyncio.Event,
    log: logging.LoggerAdapter,  # type: ignore[type-arg]
    beat: asyncio.Event | None = None,
    retry: Retry | None = None,
) -> None:
    """Runs until cancelled or the run is lost. Setting `beat` asks for an immediate beat."""
    interval = lease_seconds / 3
    beat = beat if beat is not None else asyncio.Event()
    retry = retry if retry is not None else Retry(lease_seconds, log)
    while not lost.is_set():
        await wait_event(beat, interval)
        beat.clear()
        try:
            hb = await retry.call(
                pool,
                lambda conn: api.heartbeat(conn, run.run_id, run.claim_token, lease_seconds),
                "heartbeat",
            )
        except DatabaseUnavailable:
            log.warning("heartbeat: no database for about a lease; giving the run up (a reaper takes it)")
            lost.set()
            return
        except Exception as exc:
            log.warning("heartbeat failed, retrying at the next beat: %s", exc)
            continue
        if not hb.owned:
            log.warning("heartbeat: the run is no longer ours (reaped, stopped or superseded); standing down")
            metrics.fenced("heartbeat")
            lost.set()
            return
        if hb.cancel_requested and not cancel.is_set():
            log.info("heartbeat: cancel requested")
            cancel.set()
