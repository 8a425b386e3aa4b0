"""A connection returned by a task that is cancelled mid-return still reaches the client queued
for it (pyworker/db/cancel_safe_pool.py).

psycopg_pool gives a returned connection to the first queued client by popping the client and
then awaiting the client's condition lock. A queued client holds that lock for the moment between
queueing and waiting; here the test holds it, which makes that moment as long as the test needs,
so the cancellation lands on that await every time. This reaches into psycopg_pool's private
`_waiting` queue and `WaitingClient._cond`: that is the interleaving, and there is no public way
to pin it. Without the shield the client waits out its timeout and the pool loses the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import psycopg
import psycopg_pool
import pytest
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from pyworker.db import devdb
from pyworker.db.cancel_safe_pool import RECONNECT_EVERY, CancelSafePool


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the interleaving did not happen")


async def hand_over_while_cancelled(pool: AsyncConnectionPool) -> tuple[object, dict[str, int]]:
    """A holds the only connection, B queues for it; A is cancelled while handing it to B.
    Returns what B got (a connection or the PoolTimeout) and the pool's stats afterwards."""
    held = await pool.getconn()
    queued = asyncio.create_task(pool.getconn(timeout=2))
    await until(lambda: len(pool._waiting) == 1 and len(pool._waiting[0]._cond._waiters) == 1)
    client_lock = pool._waiting[0]._cond
    await client_lock.acquire()  # B between queueing and waiting, for as long as we like
    returning = asyncio.create_task(pool.putconn(held))
    await until(lambda: not pool._waiting)  # popped: the hand-over is waiting for B's lock
    returning.cancel()
    with pytest.raises(asyncio.CancelledError):
        await returning
    client_lock.release()
    try:
        got: object = await queued
    except PoolTimeout as timeout:
        got = timeout
    else:
        await pool.putconn(got)  # type: ignore[arg-type]
    return got, pool.get_stats()


async def open_pool(cls: type[AsyncConnectionPool], url: str) -> AsyncConnectionPool:
    pool = cls(url, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False)
    await pool.open(wait=True)
    return pool


async def test_a_cancelled_return_still_reaches_the_queued_client(database_url: str) -> None:
    pool = await open_pool(CancelSafePool, database_url)
    try:
        got, stats = await hand_over_while_cancelled(pool)
        assert not isinstance(got, PoolTimeout), got
        assert stats["pool_available"] == 1, stats  # and the connection came home afterwards
        async with pool.connection(timeout=2) as conn:
            assert (await (await conn.execute("SELECT 1")).fetchone()) == (1,)
    finally:
        await pool.close()


async def test_the_plain_pool_loses_both(database_url: str) -> None:
    """The same interleaving on psycopg_pool's own pool, as installed: it is why CancelSafePool
    exists. A release that fixes it skips this test, saying so, rather than failing CI."""
    pool = await open_pool(AsyncConnectionPool, database_url)
    try:
        got, stats = await hand_over_while_cancelled(pool)
    finally:
        await pool.close()
    if not isinstance(got, PoolTimeout):
        version = psycopg_pool.__version__
        pytest.skip(f"psycopg_pool {version} hands over despite the cancellation: CancelSafePool can go")
    assert stats["pool_available"] == 0, stats  # and the connection is gone too


async def test_the_connection_returned_last_is_handed_out_next(database_url: str) -> None:
    """One call at a time keeps to one server backend, whose caches stay warm; psycopg_pool's own
    order would hand out `first`, idle longest, and the connections would take turns."""
    pool = CancelSafePool(database_url, min_size=3, max_size=3, kwargs={"autocommit": True}, open=False)
    await pool.open(wait=True)
    try:
        first, second, last = [await pool.getconn() for _ in range(3)]
        for conn in (first, second, last):
            await pool.putconn(conn)
        for _ in range(3):
            async with pool.connection(timeout=2) as conn:
                assert conn is last
        # Two at once: the two returned last, and the one idle longest stays idle.
        both = {await pool.getconn(), await pool.getconn()}
        assert both == {last, second}
        for conn in both:
            await pool.putconn(conn)
        assert pool.get_stats()["pool_available"] == 3
    finally:
        await pool.close()


# Seconds the database is away. psycopg_pool's attempts come at about 0, 1, 3, 7, 15 and 31 s
# after the outage is noticed, so the first one after the server is back (about 19 s) comes 9 s
# or more later; CancelSafePool's within RECONNECT_EVERY (2 s, jittered).
OUTAGE = 18.0
BACK_WITHIN = 7.0


async def test_the_pool_is_back_within_seconds_of_the_database_after_a_long_outage(tmp_path: Path) -> None:
    """A real server stopped for 18 s while the pool is in use (a failover, a long restart).
    psycopg_pool doubles its wait between reconnection attempts (1, 2, 4, 8, 16 s ...), so its
    attempt after the one at about 15 s came near 31 s, well after the server was back: `runrow
    serve` answered 503 for 18-25 s more after a 40 s outage, and cut an open stream (the HTTP
    audit). CancelSafePool tries again at least every RECONNECT_EVERY seconds."""
    assert 3 * RECONNECT_EVERY < BACK_WITHIN
    with devdb.throwaway() as cluster:
        pool = CancelSafePool(cluster.url, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False)
        await pool.open(wait=True, timeout=10)
        try:
            # The server stops at once and starts again OUTAGE seconds later; meanwhile the pool
            # is used as a service uses it.
            restarting = asyncio.create_task(asyncio.to_thread(devdb.restart_after, cluster, OUTAGE))
            await asyncio.sleep(0.5)
            while not restarting.done():
                with contextlib.suppress(psycopg.Error, PoolTimeout):
                    async with pool.connection(timeout=1) as conn:
                        await conn.execute("SELECT 1")
                await asyncio.sleep(0.5)
            await restarting  # the server accepts connections again
            async with pool.connection(timeout=BACK_WITHIN) as conn:
                await conn.execute("SELECT 1")
        finally:
            await pool.close()
