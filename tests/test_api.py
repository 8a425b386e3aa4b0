"""The typed wrappers in pyworker.db.api: each runrow.* lifecycle function, called with named
arguments, returns the documented shape; fenced-out writes come back as None/False."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest
from worker_support import worker_db

from pyworker.db import api, channels

__all__ = ["worker_db"]


@pytest.fixture
async def conn(worker_db: str) -> AsyncIterator[psycopg.AsyncConnection]:
    c = await psycopg.AsyncConnection.connect(worker_db, autocommit=True)
    yield c
    await c.close()


async def test_events_channel_matches_sql(conn) -> None:
    run_id = uuid.uuid4()
    row = await (await conn.execute("SELECT runrow.events_channel(run_id => %s)", (run_id,))).fetchone()
    assert channels.events_channel(run_id) == channels.events_channel(str(run_id)) == row[0]


async def test_lifecycle_through_the_wrappers(conn) -> None:
    conv = uuid.uuid4()
    first = await api.enqueue_run(
        conn, conv, "hello", "echo", metadata={"echo": "hi"}, idempotency_key=str(conv)
    )
    assert first.status == "queued" and first.created
    again = await api.enqueue_run(
        conn, conv, "hello", "echo", metadata={"echo": "hi"}, idempotency_key=str(conv)
    )
    assert again.run_id == first.run_id and not again.created

    run = await api.claim_run(conn, "w1", 30)
    assert run is not None and run.run_id == first.run_id and run.attempt == 1
    assert run.metadata == {"echo": "hi"} and run.conversation_id == conv
    assert await api.claim_run(conn, "w1", 30) is None

    assert await api.heartbeat(conn, run.run_id, run.claim_token, 30) == api.Heartbeat(True, False)
    async with conn.transaction():  # calls compose inside one transaction
        seq = await api.append_events(
            conn, run.run_id, run.claim_token, [{"type": "text_delta", "index": 0, "text": "x"}]
        )
        assert await api.append_events(conn, run.run_id, uuid.uuid4(), [{"type": "x"}]) is None  # wrong token
    events = await api.read_events(conn, run.run_id, after_seq=seq - 1)
    assert [(e.seq, e.type, e.payload["text"]) for e in events] == [(seq, "text_delta", "x")]

    assert await api.cancel_run(conn, run.run_id) == "cancel_requested"
    assert (await api.heartbeat(conn, run.run_id, run.claim_token, 30)).cancel_requested
    assert await api.finish_run(conn, run.run_id, run.claim_token, "cancelled", {"text": "x"})
    assert not await api.finish_run(conn, run.run_id, run.claim_token, "completed")  # sticky: fenced out
    assert not (await api.heartbeat(conn, run.run_id, run.claim_token, 30)).owned
    assert (await api.read_events(conn, run.run_id))[-1].type == "complete"


async def test_release_reap_stop_and_retry(conn) -> None:
    a = await api.enqueue_run(conn, uuid.uuid4(), "a", "echo", max_attempts=2)
    (run,) = await api.claim_runs(conn, "w1", 5, 30)
    assert run.run_id == a.run_id
    assert await api.release_run(conn, run.run_id, run.claim_token, "transient") == "requeued"
    assert await api.release_run(conn, run.run_id, run.claim_token, "again") is None  # token cleared

    (run,) = await api.claim_runs(conn, "w1", 5, 1)
    assert run.attempt == 2
    assert await api.reap_expired_runs(conn, 3600, 10) == []  # lease + grace not yet expired
    assert await api.release_run(conn, run.run_id, run.claim_token, "boom") == "dead"
    retried = await api.retry_run(conn, run.run_id)
    assert retried != run.run_id

    conv = uuid.uuid4()
    b = await api.enqueue_run(conn, conv, "b", "echo")
    actions = await api.stop_conversation(conn, conv)
    assert actions == [(b.run_id, "cancelled")]
