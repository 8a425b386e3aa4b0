"""A cursor past the end of a run's journal never leaves a reader hanging (issue 9, defect 5).

A stale or foreign cursor (`?from=5000` on a run whose journal ends at seq 5) names events
that do not exist. Over SQL a terminal run's read always ends in a complete (pgtap/
read_events.sql), so the shared tail ends when the run does, whatever its cursor. Over HTTP a
live run answers 400 naming the cursor at once (an EventSource does not reconnect after a
4xx), a finished one 204, as for a client that saw the end; `runrow tail --from` says the same
with exit 2, or exits with the run's status. Every test is under a deadline: the bug was a hang.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import psycopg
import pytest
from http_support import ALICE, Server, error_of, serve
from psycopg_pool import AsyncConnectionPool
from tail_support import append, claim, enqueue, finish, finished_run, journal, private_database_url
from test_cli import runrow

from pyworker.db.cancel_safe_pool import CancelSafePool
from pyworker.db.tail import Keepalive, tail

__all__ = ["private_database_url"]


@pytest.fixture(scope="module")
def server(private_database_url: str) -> Iterator[Server]:
    yield from serve(private_database_url)


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


@pytest.fixture
def db(private_database_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(private_database_url, autocommit=True) as conn:
        yield conn
        # Claims take the oldest queued run: leave none behind for the next test's claim.
        for (run_id,) in conn.execute("SELECT id FROM runrow.agent_run WHERE status = 'queued'").fetchall():
            conn.execute("SELECT runrow.cancel_run(run_id => %s)", (run_id,))


@pytest.fixture
async def pool(private_database_url: str) -> AsyncIterator[AsyncConnectionPool]:
    p = CancelSafePool(private_database_url, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False)
    await p.open()
    yield p
    await p.close()


def alices_live_run(client: httpx.Client, db: psycopg.Connection) -> tuple[uuid.UUID, uuid.UUID]:
    """A run of alice's, claimed, with two deltas: its journal ends at seq 5."""
    response = client.post(f"/conversations/{uuid.uuid4()}/runs", json={"content": "hi"}, headers=ALICE)
    assert response.status_code == 202, response.text
    run_id = uuid.UUID(response.json()["run_id"])
    token = claim(db, run_id)
    append(db, run_id, token, [{"type": "text_delta", "text": "a"}, {"type": "text_delta", "text": "b"}])
    assert journal(db, run_id)[-1][0] == 5
    return run_id, token


def live_run(db: psycopg.Connection) -> tuple[uuid.UUID, uuid.UUID]:
    """A claimed run (no owner) with one delta: its journal ends at seq 4."""
    run_id = enqueue(db)
    token = claim(db, run_id)
    append(db, run_id, token, [{"type": "text_delta", "text": "x"}])
    return run_id, token


def status_of_stream(client: httpx.Client, run_id: uuid.UUID, **kw: object) -> httpx.Response:
    # The status line comes before any frame: a stream that would hang is seen at once.
    with client.stream("GET", f"/runs/{run_id}/events", **kw) as response:  # type: ignore[arg-type]
        if response.status_code != 200:
            response.read()
        return response


def test_sse_from_past_the_end_of_a_live_run_is_a_400_that_names_the_cursor(
    client: httpx.Client, db: psycopg.Connection
) -> None:
    run_id, _ = alices_live_run(client, db)
    before = journal(db, run_id)
    response = status_of_stream(client, run_id, params={"from": "5000"}, headers=ALICE)
    assert response.status_code == 400, "a stale cursor on a live run must not stream keepalives forever"
    message = error_of(response)["message"]
    assert "from 5000" in message and "past the end" in message, message
    response = status_of_stream(client, run_id, headers={**ALICE, "Last-Event-ID": "6"})
    assert response.status_code == 400
    assert "Last-Event-ID 6" in error_of(response)["message"]
    # The last seq itself is a fine cursor: the stream opens and waits for what comes next.
    assert status_of_stream(client, run_id, params={"from": "5"}, headers=ALICE).status_code == 200
    assert journal(db, run_id) == before, "refusing a cursor writes nothing"
    assert client.get(f"/runs/{run_id}", headers=ALICE).json()["status"] == "running"


def test_sse_from_past_the_end_of_a_finished_run_is_204(client: httpx.Client, db: psycopg.Connection) -> None:
    run_id, token = alices_live_run(client, db)
    finish(db, run_id, token)  # complete at seq 6
    for cursor in ("6", "7", "5000"):
        assert status_of_stream(client, run_id, params={"from": cursor}, headers=ALICE).status_code == 204
    response = status_of_stream(client, run_id, params={"from": "5"}, headers=ALICE)
    assert response.status_code == 200


async def test_a_tail_with_a_cursor_past_the_end_ends_when_the_run_ends(
    pool: AsyncConnectionPool, db: psycopg.Connection
) -> None:
    run_id, token = live_run(db)

    async def follow() -> list[object]:
        items = tail(pool, None, run_id, from_seq=5000, keepalive=30.0, poll_interval=0.05)
        return [i async for i in items if not isinstance(i, Keepalive)]

    follower = asyncio.ensure_future(follow())
    await asyncio.sleep(0.3)
    assert not follower.done(), "the run is live: the tail waits"
    await asyncio.to_thread(finish, db, run_id, token)
    async with asyncio.timeout(10):
        assert await follower == [], "the run ended: a tail past the end ends too, with nothing to show"


def test_cli_tail_from_past_the_end_of_a_live_run_says_so(
    private_database_url: str, db: psycopg.Connection
) -> None:
    run_id, _ = live_run(db)
    result = runrow(private_database_url, "tail", str(run_id), "--from", "5000", timeout=30)
    assert result.returncode == 2, result.stderr
    assert "--from 5000" in result.stderr and "past the end" in result.stderr, result.stderr
    assert result.stdout == ""


def test_cli_tail_from_past_the_end_of_a_finished_run_exits_with_its_status(
    private_database_url: str, db: psycopg.Connection
) -> None:
    run_id = finished_run(db, ["gone"], status="failed")
    result = runrow(private_database_url, "tail", str(run_id), "--from", "5000", timeout=30)
    assert result.returncode == 1, result.stderr
    assert result.stdout == "" and "status=failed" in result.stderr
