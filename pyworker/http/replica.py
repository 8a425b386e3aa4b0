"""Event streams that read journals from a hot standby (`runrow serve --replica-url`).

Why a standby can serve `read_events` without ever showing a client something false:

- A standby shows a prefix of the primary's commits in WAL order. A run's journal seqs are
  gap-free and each append commits after the one before it, so the replica's journal is always
  events 1..k of the primary's: a cursor read on it is a read of the past, never out of order.
- Terminal states are sticky (a trigger) and the `complete` event commits in the same
  transaction as the terminal status. A run terminal on the standby is terminal on the primary,
  with the same result and error, so the `complete` that `read_events` synthesizes from its row
  (trimmed journal, or a cursor past the end) is the truth, not a guess.
- A run that is still running on the standby may have ended on the primary: the read returns no
  complete, and the tail waits until the standby replays it. Wakes come from the primary's
  LISTEN and name the seq journaled; the tail re-reads until the standby has it.

What lag can make look wrong, and is confirmed on the primary instead: a run the standby does
not have yet (enqueued a moment ago) and a cursor beyond the standby's end of the journal (the
client read it elsewhere, from the primary or a standby further ahead). Everything else the
service does (ownership, enqueue, stop, status) stays on the primary.
"""

from __future__ import annotations

import logging
from uuid import UUID

from psycopg_pool import AsyncConnectionPool

from pyworker.http.config import ServeConfig
from pyworker.http.context import Services
from pyworker.tail import CursorPastEnd, RunNotFound, check_cursor

log = logging.getLogger("runrow.http")


async def open_replica_pool(config: ServeConfig) -> AsyncConnectionPool:
    assert config.replica_url is not None
    pool = AsyncConnectionPool(
        config.replica_url,
        min_size=config.pool_min_size,
        max_size=config.pool_max_size,
        kwargs={"autocommit": True, "application_name": "runrow-serve-replica"},
        open=False,
    )
    await pool.open(wait=True, timeout=30)
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT pg_is_in_recovery()")
        row = await cur.fetchone()
    if row is not None and row[0]:
        log.info("event streams read journals from a hot standby (--replica-url)")
    else:
        log.warning("--replica-url is not a standby (not in recovery): event streams read a primary there")
    return pool


async def stream_cursor(svc: Services, run_id: UUID, cursor: int) -> bool:
    """check_cursor on the journal pool; what lag alone could cause there is decided by the primary."""
    if not svc.journal_on_replica:
        return await check_cursor(svc.pool, run_id, cursor)
    try:
        return await check_cursor(svc.journal, run_id, cursor)
    except (CursorPastEnd, RunNotFound):
        return await check_cursor(svc.pool, run_id, cursor)
