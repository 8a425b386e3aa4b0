"""How many event streams one user may hold open on a `runrow serve` instance (the security
audit: one token held 1,100 open, each a task, a socket and a tail). Past the limit a new stream
is a 429 with Retry-After naming the flag; other users are not affected, and a stream closed
frees its place."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import psycopg
import pytest
from http_support import ALICE, BOB, Server, private_database, serve
from starlette.types import Message
from worker_support import wait_until

from pyworker.http.sse import EventStreamResponse, StreamStats


@pytest.fixture(scope="module")
def limits_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_streams")


@pytest.fixture
def server(limits_db: str) -> Iterator[Server]:
    yield from serve(limits_db, max_streams_per_user=2)


def test_a_user_past_the_stream_limit_gets_a_429_and_others_do_not(limits_db: str, server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=20) as client:
        made = client.post(f"/conversations/{uuid.uuid4()}/runs", json={"content": "hi"}, headers=ALICE)
        run = made.json()["run_id"]
        with psycopg.connect(limits_db, autocommit=True) as db:  # running, never ending
            db.execute("SELECT * FROM runrow.claim_runs('streams', 1, 3600)").fetchall()
        stop = threading.Event()
        opened: list[int] = []

        def hold(headers: dict[str, str]) -> None:
            with client.stream("GET", f"/runs/{run}/events", headers=headers) as response:
                opened.append(response.status_code)
                for _ in response.iter_raw():
                    if stop.is_set():
                        return

        holders = [threading.Thread(target=hold, args=(ALICE,), daemon=True) for _ in range(2)]
        for holder in holders:
            holder.start()
        try:
            wait_until(lambda: server.services.streams.by_user.get("alice") == 2, 10, "two streams")
            refused = client.get(f"/runs/{run}/events", headers=ALICE)
            assert refused.status_code == 429 and refused.headers["Retry-After"] == "5", refused.text
            assert refused.json()["error"]["type"] == "too_many_streams"
            assert "--max-streams-per-user" in refused.json()["error"]["message"]
            # Another user is not held to alice's count: bob streams his own run meanwhile.
            mine = client.post(f"/conversations/{uuid.uuid4()}/runs", json={"content": "hi"}, headers=BOB)
            with client.stream("GET", f"/runs/{mine.json()['run_id']}/events", headers=BOB) as bobs:
                assert bobs.status_code == 200
        finally:
            stop.set()
            time.sleep(0.6)  # a keepalive (0.5 s) lets each holder see the stop and close
            for holder in holders:
                holder.join(5)
        wait_until(lambda: "alice" not in server.services.streams.by_user, 10, "the streams to close")
        assert opened == [200, 200]


async def test_a_stream_cancelled_twice_while_closing_frees_its_place() -> None:
    """At shutdown a stream's task can be cancelled again while it waits for its tail to close.
    That second cancellation left the response's finally before the count went down: the user
    kept a place for a stream that no longer existed (at the limit, a 429 for it), and the
    process's open count never came back to 0."""
    stats = StreamStats()
    streaming = asyncio.Event()
    closing = asyncio.Event()
    closed = asyncio.Event()  # set at the end: the slow tail finishes, no task is left pending
    sent: list[Message] = []

    async def frames() -> AsyncIterator[bytes]:
        try:
            yield b"data: {}\n\n"
            streaming.set()  # the first frame was sent
            await asyncio.Event().wait()
        finally:
            closing.set()
            await closed.wait()  # a tail slow to close: the response waits for it

    async def receive() -> Message:
        await asyncio.Event().wait()  # the client never hangs up
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    response = EventStreamResponse(frames(), stats, user="alice", max_per_user=2)
    task = asyncio.create_task(response({"type": "http", "method": "GET"}, receive, send))
    async with asyncio.timeout(5):
        await streaming.wait()
    assert stats.by_user == {"alice": 1} and [m["type"] for m in sent][:2] == [
        "http.response.start",
        "http.response.body",
    ]
    task.cancel()
    async with asyncio.timeout(5):
        await closing.wait()  # the response is in its finally, waiting for the stream to close
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stats.by_user == {}
    assert stats.open == 0
    closed.set()
    for _ in range(3):
        await asyncio.sleep(0)
