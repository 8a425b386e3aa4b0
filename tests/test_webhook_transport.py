"""The webhook sender connects to a receiver's addresses as a connect to its name would: the next
address is tried beside one that has not answered after STAGGER_SECONDS (RFC 8305), so a first
address that drops packets does not spend the attempt. c62868f tried them one by one, each with
the whole connect timeout, which is also the attempt's: a receiver whose first address was a
black hole was never reached (the final review of stop 60; anyio's connect to the name had
reached its second address after 0.25 s).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
from dns_support import fake_dns

from pyworker.worker.webhook_transport import sender_client

NAME = "two-addresses.example"


@pytest.fixture
def receiver() -> Iterator[tuple[int, socket.socket]]:
    """A port on which 127.0.0.1 answers HTTP 200 and 127.0.0.2 drops every SYN (a listener of
    backlog 0 whose queue is full, nobody accepting: Linux drops the SYN, the connect hangs)."""
    live = socket.create_server(("127.0.0.1", 0))
    port = live.getsockname()[1]
    hole = socket.create_server(("127.0.0.2", port), backlog=0)
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.2", port))
        fillers.append(filler)
    live.setblocking(False)
    yield port, live
    for s in (live, hole, *fillers):
        s.close()


async def _serve(listener: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    while True:
        conn, _ = await loop.sock_accept(listener)
        await loop.sock_recv(conn, 65536)
        await loop.sock_sendall(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        conn.close()


async def test_a_first_address_that_drops_packets_does_not_spend_the_attempt(
    receiver: tuple[int, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, listener = receiver
    fake_dns(monkeypatch, {NAME: ["127.0.0.2", "127.0.0.1"]})
    server = asyncio.ensure_future(_serve(listener))
    try:
        async with sender_client(timeout=5.0, user_agent="test", proxy=None, allow_private=True) as client:
            # The attempt's bound below the connect timeout, as deliver()'s equals it: one by
            # one, the black hole took all of it.
            async with asyncio.timeout(2.5):
                response = await client.post(f"http://{NAME}:{port}/hooks", content=b"{}")
        assert response.status_code == 200
    finally:
        server.cancel()
