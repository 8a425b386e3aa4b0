"""What a worker does when the database goes away for a moment: a restart, a failover, a
serialization failure. One policy for every call a worker makes on a run's behalf.

A transient error never ends or releases a run by itself: the call is made again on a fresh
connection, and the fence decides whether this worker still owns the run (heartbeat
`owned`, append_events / append_step NULL, finish_run false). Transient means the server
could not answer, not that it refused the input:

- the connection was lost or could not be made (class 08, no SQLSTATE at all, the pool had
  no connection in time), the server ended the session (57P01 admin shutdown, 57P02 crash of
  another backend, 57P03 cannot connect now, 25P03 idle-in-transaction timeout, 53300 too
  many connections), a failover left this session on a read-only node (25006), the server
  is out of disk or memory (53100, 53200: every write of the fleet alike, not this call's);
- the transaction lost a race it can win next time: 40001 serialization_failure, 40P01
  deadlock_detected.

Everything else (22 bad input, 23 constraints, 42 a bug, 55000 wrong state, ...) is raised
at once: retrying it would only repeat it. Whether it then ends the run failed once (the
database refused the run's own data) or hands it back is pyworker/worker/failures.py's call;
the two sets are disjoint.

Bounded: a call that keeps failing for `budget` seconds (about one lease) raises
DatabaseUnavailable. The caller then gives the run up quietly: it stops working and writes
nothing more; by then the lease has lapsed, and a reaper takes the run once the database is
back. Backoff sleeps are local (they decide when to ask, never what is true).

A write whose COMMIT went unanswered may or may not have committed. `Retry.transaction` keeps
what the transaction returned before its COMMIT and asks the caller's read-back whether it
landed before doing it again: steps would otherwise be appended twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

T = TypeVar("T")

# The server ended the session: whatever it was doing when it did may or may not have committed.
SESSION_ENDED = frozenset({"57P01", "57P02", "57P03", "25P03"})
# The server could not serve this session now; the same call may work on a fresh one. Class 53
# (insufficient resources) says nothing about the call: a full disk (53100) or memory (53200)
# refused every write of the fleet alike, and was taken for a refusal of this run's, which
# handed the run back to be paid for again, attempt after attempt, until it died.
UNAVAILABLE = SESSION_ENDED | {"53300", "25006", "53100", "53200"}
# The transaction lost a race with another; it rolled back and can simply run again.
RACE_LOST = frozenset({"40001", "40P01"})
# Connection-level failures on a connection the pool handed out are retried at once, this many
# times in a row: after a restart every idle pooled connection is dead, and each try discards one.
IMMEDIATE_RETRIES = 8


class DatabaseUnavailable(Exception):
    """The database stayed out of reach for the whole budget (about a lease): give the run up
    quietly, write nothing more; a reaper takes it once the database is back."""


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` says the database could not answer now (retry) rather than refused (raise)."""
    if isinstance(exc, PoolClosed) or not isinstance(exc, psycopg.Error):
        return False  # the worker is shutting its pool: nothing to wait for
    state = exc.sqlstate
    if state is None:
        # Raised by the client, not the server: connection lost or refused, pool timeout.
        return isinstance(exc, psycopg.OperationalError)
    return state.startswith("08") or state in UNAVAILABLE or state in RACE_LOST


def _connection_lost(exc: BaseException) -> bool:
    state = getattr(exc, "sqlstate", None)
    return isinstance(exc, psycopg.OperationalError) and (
        state is None or state.startswith("08") or state in SESSION_ENDED
    )


def outcome_unknown(exc: BaseException) -> bool:
    """Whether a COMMIT that failed with `exc` may still have taken effect. An ERROR answer
    (a deferred constraint, a serialization failure) means the server rolled back; a lost
    connection, or a session the server ended around the COMMIT, leaves it unknown."""
    if not isinstance(exc, psycopg.Error):
        return True  # cancelled while waiting for the answer
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in SESSION_ENDED


class Attempts:
    """The state of one retried call: when it first failed, how often, the next pause."""

    def __init__(self, retry: Retry, what: str) -> None:
        self._retry = retry
        self.what = what
        self.failures = 0
        self._since: float | None = None
        self._in_a_row = 0

    def remaining(self) -> float:
        """Seconds left of the budget (all of it before the first failure)."""
        if self._since is None:
            return self._retry.budget
        return max(0.0, self._retry.budget - (time.monotonic() - self._since))

    async def failed(self, exc: BaseException) -> None:
        """Called with a transient error: pause before the next try, or raise
        DatabaseUnavailable once the budget is spent."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        self.failures += 1
        retry = self._retry
        if now - self._since >= retry.budget:
            retry.log.warning(
                "%s: no database for %.0fs (%d tries); giving up: %s",
                self.what,
                retry.budget,
                self.failures,
                exc,
            )
            raise DatabaseUnavailable(f"{self.what}: no database for {retry.budget:.0f}s: {exc}") from exc
        if self.failures == 1:
            retry.log.warning("%s: database unavailable, retrying: %s", self.what, _one_line(exc))
        else:
            retry.log.debug("%s: retry %d failed: %s", self.what, self.failures, _one_line(exc))
        if _connection_lost(exc) and self._in_a_row < IMMEDIATE_RETRIES:
            self._in_a_row += 1
            return  # most likely a pooled connection that died with the server: the next may be new
        self._in_a_row = 0
        await asyncio.sleep(
            min(retry.max_delay, retry.first_delay * 2 ** min(self.failures, 16), self.remaining())
        )

    def succeeded(self) -> None:
        if self.failures:
            self._retry.log.info(
                "%s: the database answered again after %d failed tries", self.what, self.failures
            )


class Retry:
    """The retry policy of one run (or of the journal writer): `budget` seconds of transient
    failures per call before DatabaseUnavailable. `log` says which run."""

    def __init__(
        self,
        budget: float,
        log: logging.Logger | logging.LoggerAdapter,  # type: ignore[type-arg]
        *,
        first_delay: float = 0.05,
        max_delay: float = 1.0,
    ) -> None:
        if budget <= 0:
            raise ValueError("budget must be positive")
        self.budget = budget
        self.log = log
        self.first_delay = first_delay
        self.max_delay = max_delay

    def attempts(self, what: str) -> Attempts:
        return Attempts(self, what)

    async def call(
        self, pool: AsyncConnectionPool, fn: Callable[[AsyncConnection[Any]], Awaitable[T]], what: str
    ) -> T:
        """`fn(conn)` on a pool connection (autocommit: each statement its own transaction),
        made again on a fresh connection after a transient error. Only for calls that are safe
        to repeat: reads, and writes the SQL makes idempotent or the fence makes harmless."""
        tries = self.attempts(what)
        while True:
            try:
                async with pool.connection(timeout=max(0.1, tries.remaining())) as conn:
                    result = await fn(conn)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                await tries.failed(_explained(exc, pool))
                continue
            tries.succeeded()
            return result

    async def transaction(
        self,
        pool: AsyncConnectionPool,
        body: Callable[[AsyncConnection[Any]], Awaitable[T]],
        what: str,
        *,
        landed: Callable[[AsyncConnection[Any], T], Awaitable[bool]],
    ) -> T:
        """`body(conn)` in one transaction, made again after a transient error. When the
        COMMIT went unanswered, `landed(conn, what body returned)` reads back whether that
        transaction committed after all: then its result is returned, not written twice."""
        tries = self.attempts(what)
        while True:
            done: list[T] = []  # what body returned: from here on only the COMMIT was missing
            try:
                async with pool.connection(timeout=max(0.1, tries.remaining())) as conn:
                    async with conn.transaction():
                        done.append(await body(conn))
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if done and outcome_unknown(exc):
                    self.log.warning("%s: COMMIT unanswered (%s); reading it back", what, _one_line(exc))
                    result = done[0]
                    if await self.call(pool, lambda conn, r=result: landed(conn, r), f"{what} (read-back)"):
                        self.log.warning("%s: it had committed", what)
                        return result
                    self.log.warning("%s: it had not committed; writing it again", what)
                await tries.failed(_explained(exc, pool))
                continue
            tries.succeeded()
            return done[0]


def _explained(exc: Exception, pool: AsyncConnectionPool) -> Exception:
    """A PoolTimeout with what the server answered the pool's last attempt to connect, if it
    failed (CancelSafePool keeps it): "couldn't get a connection after 9.00 sec" alone read the
    same for a server out of connection slots as for one that was down, or a pool held busy."""
    why = getattr(pool, "last_error", None)
    if not isinstance(exc, PoolTimeout) or why is None:
        return exc
    explained = PoolTimeout(f"{exc}; the last attempt to connect: {_one_line(why)}")
    explained.__cause__ = exc
    return explained


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
