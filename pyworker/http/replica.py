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

What lag alone can make look wrong, and is confirmed on the primary instead: a run the standby
does not have yet (enqueued a moment ago) and a cursor beyond the standby's end of the journal
(the client read it elsewhere, from the primary or a standby further ahead). Everything else the
service does (ownership, enqueue, stop, status) stays on the primary.

A standby that cannot be reached is no reason to refuse a stream: the primary is never behind,
so a stream opened while the standby is failing reads the primary, and the standby is tried
again after RETRY_AFTER seconds. A stream whose standby fails mid-way ends, and its client
resumes with Last-Event-ID as from any dropped connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool

from pyworker.db import finite_json
from pyworker.db.cancel_safe_pool import CancelSafePool
from pyworker.db.tail import CursorPastEnd, RunNotFound, check_cursor
from pyworker.http.config import ServeConfig

if TYPE_CHECKING:
    from pyworker.http.context import Services

log = logging.getLogger("runrow.http")


# A standby that failed is left alone this long; streams opened meanwhile read the primary.
RETRY_AFTER = 5.0
# How long a stream waits for a standby connection before it reads the primary instead.
CONNECT_TIMEOUT = 2.0


class Replica:
    """The standby's pool and whether it is to be tried now."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool
        self._down_until = 0.0

    @property
    def usable(self) -> bool:
        return time.monotonic() >= self._down_until

    def failed(self, exc: BaseException) -> None:
        if self.usable:
            log.warning("hot standby unavailable (%s): streams read the primary for %g s", exc, RETRY_AFTER)
        self._down_until = time.monotonic() + RETRY_AFTER


async def open_replica(config: ServeConfig, limits: dict[str, Any] | None = None) -> Replica:
    assert config.replica_url is not None
    pool = CancelSafePool(
        config.replica_url,
        min_size=config.pool_min_size,
        max_size=config.pool_max_size,
        kwargs={"autocommit": True, "application_name": "runrow-serve-replica", **(limits or {})},
        configure=finite_json.configure,  # a number past the float range must not break JSON out
        timeout=CONNECT_TIMEOUT,
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
    return Replica(pool)


@dataclass(frozen=True)
class StreamSource:
    """Where one stream reads: the standby's pool (`replica` True) or the primary's."""

    pool: AsyncConnectionPool
    replica: bool


async def open_stream(svc: Services, run_id: UUID, cursor: int) -> tuple[bool, StreamSource]:
    """check_cursor where the stream will read, and that place. What lag alone could cause on
    the standby is decided by the primary; a standby that fails is replaced by the primary."""
    replica = svc.replica
    if replica is not None and replica.usable:
        try:
            return await check_cursor(replica.pool, run_id, cursor), StreamSource(replica.pool, True)
        except (CursorPastEnd, RunNotFound):
            return await check_cursor(svc.pool, run_id, cursor), StreamSource(replica.pool, True)
        except psycopg.OperationalError as exc:
            replica.failed(exc)
    return await check_cursor(svc.pool, run_id, cursor), StreamSource(svc.pool, False)


async def watched(frames: AsyncIterator[bytes], replica: Replica | None) -> AsyncIterator[bytes]:
    """The frames of a stream reading the standby; a standby failure ends it and is remembered,
    so the client's reconnect reads the primary."""
    try:
        async with aclosing(frames) as items:  # type: ignore[type-var]
            async for chunk in items:
                yield chunk
    except psycopg.OperationalError as exc:
        if replica is not None:
            replica.failed(exc)
        raise
