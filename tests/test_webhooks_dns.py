"""A receiver whose nameserver never answers costs the webhook sender nothing beyond its own
attempts: its host look-ups run in threads of the sender's own (webhook_transport), not in
asyncio's default pool, which psycopg's reconnects and the Anthropic SDK share. They did: each
look-up held a pool thread for the resolver's own timeout after its attempt ended, an unrelated
look-up then waited 28 s, and asyncio.run waited 30 s for those threads at exit (the webhooks
audit). Here the resolver hangs for the receiver's name (socket.getaddrinfo, the function both
asyncio's pool and the sender's threads call) while answering every other name at once.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from worker_support import db, worker_db

from pyworker.worker.webhooks import WebhookSettings, webhook_loop

__all__ = ["db", "worker_db"]

HUNG = "hook.dns-never-answers.example"
DELIVERIES = 40  # more than asyncio's default pool has threads (min(32, cores + 4))


def test_a_receiver_whose_dns_hangs_holds_no_shared_thread_nor_the_exit(
    db: psycopg.Connection, worker_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(DELIVERIES):
        db.execute(
            "SELECT runrow.enqueue_run(conversation_id => %s, content => %s, model => 'echo', "
            "webhook_url => %s)",
            (uuid.uuid4(), Jsonb("hi"), f"http://{HUNG}/hooks"),
        )
    db.execute(
        "SELECT runrow.finish_run(c.run_id, c.claim_token, 'completed', '{}') "
        "FROM runrow.claim_runs('sql', %s, 60) AS c",
        (DELIVERIES,),
    )
    real = socket.getaddrinfo
    answer = threading.Event()  # the hung resolver's answer, given when the test ends
    asked: list[float] = []  # list.append is atomic

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in (HUNG, HUNG.encode()):
            asked.append(time.monotonic())
            answer.wait(30)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    settings = WebhookSettings(secret="whsec_test", timeout=0.5, batch=DELIVERIES, per_receiver=DELIVERIES)
    measured: dict[str, float] = {}

    async def main() -> None:
        pool = AsyncConnectionPool(worker_db, min_size=1, max_size=4, kwargs={"autocommit": True}, open=False)
        await pool.open(wait=True)
        stopping = asyncio.Event()
        sender = asyncio.create_task(webhook_loop(pool, settings, worker_id="w1", stopping=stopping))
        try:
            # Eight look-ups under way: more than asyncio's pool runs on 2 cores (6), which never
            # starts a 7th while the first 6 hang; the sender's own threads take all 40 at once.
            # (Polled: a thread waiting for them would come from that pool.)
            deadline = time.monotonic() + 3
            while len(asked) < 8 and time.monotonic() < deadline:  # noqa: ASYNC110 (set in threads)
                await asyncio.sleep(0.01)
            started = time.monotonic()
            try:
                await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo("localhost", 80), 5)
            except TimeoutError:
                pass
            measured["lookup"] = time.monotonic() - started
        finally:
            stopping.set()
            await sender
            await pool.close()
            measured["stopping"] = time.monotonic()

    # The hung look-ups end on their own after 15 s at most (in case they were waited for).
    watchdog = threading.Timer(15, answer.set)
    watchdog.start()
    try:
        asyncio.run(main())  # what `runrow worker` runs: its exit waits for asyncio's pool
        exited = time.monotonic() - measured["stopping"]
    finally:
        answer.set()
        watchdog.cancel()
    assert measured["lookup"] < 2, f"an unrelated look-up waited {measured['lookup']:.1f} s"
    assert exited < 2, f"asyncio.run waited {exited:.1f} s for look-up threads at exit"
