"""The reaper loop trims old journals: the live journal is a delivery buffer, emptied by the
workers themselves, while runs, messages and steps stay."""

from __future__ import annotations

import asyncio
import contextlib

import psycopg
from psycopg_pool import AsyncConnectionPool
from tail_support import finished_run
from worker_support import pool, worker_db, worker_db_superuser

from pyworker.worker import reaper

__all__ = ["pool", "worker_db", "worker_db_superuser"]


def _backdate(superuser_db: str, run_id: object, hours: int) -> None:
    """Make a run look ended `hours` ago, and enqueued then too (run_request's key is a UUIDv7
    of the enqueue, and trim_journal walks it: a run never ends before it was enqueued). Its
    row is sticky-terminal, so the test steps around the guard triggers as the superuser, the
    way only a test may."""
    with psycopg.connect(superuser_db, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            "UPDATE runrow.agent_run SET finished_at = now() - make_interval(hours => %s) WHERE id = %s",
            (hours, run_id),
        )
        conn.execute(
            "UPDATE runrow.run_request SET id = encode(overlay(uuid_send(id) PLACING substr(int8send("
            "floor(extract(EPOCH FROM now() - make_interval(hours => %s)) * 1000)::bigint), 3)"
            " FROM 1 FOR 6), 'hex')::uuid WHERE run_id = %s",
            (hours, run_id),
        )


def _journal(db: str, run_id: object) -> list[str]:
    with psycopg.connect(db) as conn:
        rows = conn.execute("SELECT type FROM runrow.run_event WHERE run_id = %s ORDER BY seq", (run_id,))
        return [r[0] for r in rows.fetchall()]


async def test_a_reaper_pass_trims_journals_of_runs_ended_long_ago(
    worker_db: str, worker_db_superuser: str, pool: AsyncConnectionPool
) -> None:
    with psycopg.connect(worker_db, autocommit=True) as conn:
        old = finished_run(conn, ["old ", "answer"])
        recent = finished_run(conn, ["recent"])
    _backdate(worker_db_superuser, old, hours=30)

    assert await reaper.trim_once(pool, 24 * 3600) > 0
    assert _journal(worker_db, old) == [], "the old run's journal is gone"
    assert "complete" in _journal(worker_db, recent), "a run that ended recently keeps its journal"
    with psycopg.connect(worker_db) as conn:
        status, snapshots = conn.execute(
            "SELECT status, (SELECT count(*) FROM runrow.run_request WHERE run_id = a.id)"
            " FROM runrow.agent_run AS a WHERE a.id = %s",
            (old,),
        ).fetchone()
        assert (status, snapshots) == ("completed", 0), "the run stays; its PII snapshot goes"
        last = conn.execute("SELECT type, payload FROM runrow.read_events(%s)", (old,)).fetchall()
        assert last == [("complete", last[0][1])] and last[0][1]["synthesized"] is True


async def test_the_reaper_loop_trims_on_its_own(
    worker_db: str, worker_db_superuser: str, pool: AsyncConnectionPool
) -> None:
    with psycopg.connect(worker_db, autocommit=True) as conn:
        old = finished_run(conn, ["bye"])
    _backdate(worker_db_superuser, old, hours=2)
    loop = asyncio.create_task(reaper.reaper_loop(pool, interval=0.05, grace_seconds=30, trim_after=3600))
    try:
        for _ in range(200):
            if not _journal(worker_db, old):
                break
            await asyncio.sleep(0.05)
        assert _journal(worker_db, old) == []
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop


async def test_trim_after_none_never_trims(
    worker_db: str, worker_db_superuser: str, pool: AsyncConnectionPool
) -> None:
    with psycopg.connect(worker_db, autocommit=True) as conn:
        old = finished_run(conn, ["kept"])
    _backdate(worker_db_superuser, old, hours=48)
    loop = asyncio.create_task(reaper.reaper_loop(pool, interval=0.05, grace_seconds=30, trim_after=None))
    await asyncio.sleep(0.5)
    loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop
    assert "complete" in _journal(worker_db, old)
