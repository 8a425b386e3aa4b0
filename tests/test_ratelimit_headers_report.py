"""The block a response's rate-limit headers call for is written beside the stream, never in its
way (pyworker/agent/limits.py after_headers): awaited before the body, the write delayed the
answer's first token by its own length (up to a lease while the database was away), and its
error (a database one commit older than the worker, without report_rate_limit_exhausted)
failed an answer the API had already billed (the review). Real database, real locks."""

from __future__ import annotations

import asyncio
import logging
import uuid

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from worker_support import db, pool, wait_until_async, worker_db

from pyworker.agent import limits
from pyworker.db import api
from pyworker.db.retry import Retry
from pyworker.worker import metrics
from pyworker.worker.handler import RunContext
from pyworker.worker.journal import JournalWriter
from pyworker.worker.logs import run_logger

__all__ = ["db", "pool", "worker_db"]

EMPTY = {
    "date": "Wed, 01 Jan 2025 00:00:00 GMT",
    "anthropic-ratelimit-requests-limit": "2",
    "anthropic-ratelimit-requests-remaining": "0",
    "anthropic-ratelimit-requests-reset": "2025-01-01T00:00:10Z",
}


async def context(pool: AsyncConnectionPool, key: str) -> RunContext:
    async with pool.connection() as conn:
        await api.enqueue_run(conn, uuid.uuid4(), "hi", "echo", fleet=api.FleetOptions(rate_limit_key=key))
        run = await api.claim_run(conn, "headers-test", 60)
    assert run is not None
    lost = asyncio.Event()
    log = run_logger(run, "headers-test")
    return RunContext(
        run=run,
        pool=pool,
        journal=JournalWriter(pool, interval=3600).run_journal(run, lost),
        cancel=asyncio.Event(),
        lost=lost,
        log=log,
        worker_id="headers-test",
        retry=Retry(30, log),
    )


def blocked_for(db: psycopg.Connection, key: str) -> float | None:
    row = db.execute(
        "SELECT extract(EPOCH FROM blocked_until - now())::float8 FROM runrow.rate_limit "
        "WHERE rate_limit_key = %s AND blocked_until > now()",
        (key,),
    ).fetchone()
    return row and row[0]


async def test_the_block_does_not_wait_for_the_key_row(
    pool: AsyncConnectionPool, db: psycopg.Connection
) -> None:
    key = f"headers-{uuid.uuid4()}"
    db.execute("SELECT runrow.set_rate_limit(%s, 100, NULL, NULL)", (key,))
    ctx = await context(pool, key)
    with psycopg.connect(db.info.dsn) as holder:  # another worker's grant, holding the key row
        holder.execute("SELECT 1 FROM runrow.rate_limit WHERE rate_limit_key = %s FOR UPDATE", (key,))
        async with asyncio.timeout(5):  # before: awaited the write, which waited on the row
            await limits.after_headers(ctx, EMPTY)  # returns with the write still waiting on it
        assert blocked_for(db, key) is None
        holder.rollback()
    await wait_until_async(lambda: blocked_for(db, key) is not None, 10, "the key blocked")
    assert 0 < (blocked_for(db, key) or 0) <= 5.0  # one request back: 10 s for 2


async def test_a_block_that_cannot_be_written_fails_nothing(
    pool: AsyncConnectionPool, db: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    key = f"headers-{uuid.uuid4()}"
    ctx = await context(pool, key)
    db.execute(
        "ALTER FUNCTION runrow.report_rate_limit_exhausted(uuid, uuid, numeric, integer) RENAME TO gone"
    )
    try:
        before = metrics.MODEL_RATE_LIMIT_REPORT_FAILED._value.get()
        with caplog.at_level(logging.WARNING, logger="runrow.run"):
            await limits.after_headers(ctx, EMPTY)  # raised UndefinedFunction into the stream before
            await wait_until_async(
                lambda: metrics.MODEL_RATE_LIMIT_REPORT_FAILED._value.get() == before + 1, 10, "counted"
            )
        assert any("could not be blocked" in r.getMessage() for r in caplog.records), caplog.records
        assert blocked_for(db, key) is None
    finally:
        db.execute(
            "ALTER FUNCTION runrow.gone(uuid, uuid, numeric, integer) RENAME TO report_rate_limit_exhausted"
        )


async def test_a_key_without_a_limit_is_paced_at_the_apis_refill_after_the_block(
    pool: AsyncConnectionPool, db: psycopg.Connection
) -> None:
    # The header's limit goes with the block: with the key's own limit unset, its waiting slots
    # were all granted at the block's end, into the API's empty bucket (bench/rate_limits.py).
    key = f"headers-{uuid.uuid4()}"
    ctx = await context(pool, key)
    await limits.after_headers(ctx, EMPTY)
    await wait_until_async(lambda: blocked_for(db, key) is not None, 10, "the key blocked")
    row = db.execute(
        "SELECT paced_requests_per_minute::float8, paced_requests_limit FROM runrow.rate_limit "
        "WHERE rate_limit_key = %s",
        (key,),
    ).fetchone()
    assert row == (12.0, 2)  # one request back per 5 s (10 s for 2), up to the 2
