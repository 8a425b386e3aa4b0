"""The webhook sender connects to public addresses only, unless the worker allows private ones.

`runrow serve` checks a user's webhook_url when it takes the request; a name answering a public
address then and 127.0.0.1 or 169.254.169.254 at delivery (DNS rebinding) had the workers POST
into the operator's network. The sender resolves hosts itself (ResolvingBackend), so it checks
every address it is about to connect to: the non-public ones are never tried, and a host with no
public one is dead-lettered on that attempt (a deterministic failure), its last_error naming
each address and why. `runrow worker --allow-private-webhooks` lifts it (receivers of one's own).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable
from typing import Any

import httpcore
import psycopg
import pytest
from test_webhooks import FAST, Receiver, delivery, enqueue_hooked, receiver, state, workers
from worker_support import db, wait_until, worker_db

from pyworker.worker.webhook_transport import NotPublic, ResolvingBackend, sender_client

__all__ = ["db", "receiver", "worker_db", "workers"]

NAME = "rebound.example"
LINK_LOCAL = "a link-local address (the cloud metadata service among them)"


def _answer(monkeypatch: pytest.MonkeyPatch, addresses: list[str]) -> None:
    """NAME resolves to `addresses`, through the getaddrinfo ResolvingBackend's threads call."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host == NAME:
            return [
                (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                for a in addresses
            ]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


class Recording(httpcore.AsyncNetworkBackend):
    """An inner backend that records each address it is asked to connect to, and refuses it."""

    def __init__(self) -> None:
        self.tried: list[str] = []

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        self.tried.append(host)
        raise httpcore.ConnectError(f"refused by the test: {host}")


@pytest.mark.parametrize(
    ("addresses", "why"),
    [
        (["127.0.0.1"], "127.0.0.1, a loopback address"),
        (["::1"], "::1, a loopback address"),
        (["::ffff:127.0.0.1"], "::ffff:127.0.0.1, a loopback address"),
        (["::ffff:10.1.2.3"], "::ffff:10.1.2.3, a private address"),
        (["169.254.169.254"], f"169.254.169.254, {LINK_LOCAL}"),
        (["fe80::1"], f"fe80::1, {LINK_LOCAL}"),
        (["10.0.0.1", "192.168.1.1"], "10.0.0.1, a private address; 192.168.1.1, a private address"),
        (["fd00::1"], "fd00::1, a private address"),
        (["0.0.0.0"], "0.0.0.0, an unspecified address"),
        (["::"], "::, an unspecified address"),
        (["224.0.0.1"], "224.0.0.1, a multicast address"),
        (["ff02::1"], "ff02::1, a multicast address"),
    ],
)
async def test_a_name_resolving_only_to_non_public_addresses_is_not_connected_to(
    monkeypatch: pytest.MonkeyPatch, addresses: list[str], why: str
) -> None:
    _answer(monkeypatch, addresses)
    inner = Recording()
    with pytest.raises(NotPublic) as refused:
        await ResolvingBackend(inner, public_only=True).connect_tcp(NAME, 443)
    assert inner.tried == []
    assert str(refused.value) == (
        f"webhook_url's host {NAME} resolves to {why}: the sender connects to public addresses only "
        "(runrow worker --allow-private-webhooks lets it reach private ones)"
    )


@pytest.mark.parametrize(
    ("host", "why"),
    [("127.0.0.1", "a loopback address"), ("::ffff:169.254.169.254", "a link-local address")],
)
async def test_an_address_as_the_host_is_checked_too(host: str, why: str) -> None:
    inner = Recording()
    with pytest.raises(NotPublic, match=f"^webhook_url's host {host} is {why}"):
        await ResolvingBackend(inner, public_only=True).connect_tcp(host, 80)
    assert inner.tried == []


async def test_only_the_public_addresses_of_a_name_are_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    _answer(monkeypatch, ["10.0.0.1", "93.184.216.34", "::1", "2606:2800:220:1:248:1893:25c8:1946"])
    inner = Recording()
    with pytest.raises(httpcore.ConnectError):
        await ResolvingBackend(inner, public_only=True).connect_tcp(NAME, 443)
    assert sorted(inner.tried) == ["2606:2800:220:1:248:1893:25c8:1946", "93.184.216.34"]


async def test_without_the_check_every_address_is_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    _answer(monkeypatch, ["127.0.0.1"])
    inner = Recording()
    with pytest.raises(httpcore.ConnectError):
        await ResolvingBackend(inner).connect_tcp(NAME, 443)
    assert inner.tried == ["127.0.0.1"]


async def test_the_senders_client_connects_to_no_rebound_receiver(monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener on 127.0.0.1 that NAME now resolves to gets no connection from the client the
    sender uses; with allow_private it is reached."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    _answer(monkeypatch, ["127.0.0.1"])
    try:
        async with sender_client(timeout=5.0, user_agent="test", proxy=None, allow_private=False) as client:
            with pytest.raises(NotPublic, match=r"resolves to 127\.0\.0\.1, a loopback address"):
                await client.post(f"http://{NAME}:{port}/hooks", content=b"{}")
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing connected
        async with sender_client(timeout=5.0, user_agent="test", proxy=None, allow_private=True) as client:
            post = asyncio.ensure_future(client.post(f"http://{NAME}:{port}/hooks", content=b"{}"))
            loop = asyncio.get_running_loop()
            conn, _ = await asyncio.wait_for(loop.sock_accept(listener), 5)
            conn.close()
            post.cancel()
            await asyncio.gather(post, return_exceptions=True)
    finally:
        listener.close()


def test_a_worker_dead_letters_a_delivery_to_a_private_address_at_once_naming_it(
    db: psycopg.Connection, receiver: Receiver, workers: Any
) -> None:
    """Through the real resolver: `localhost` is 127.0.0.1 (and ::1), where the receiver listens.
    Without --allow-private-webhooks the worker sends it nothing and the delivery ends on its
    first attempt of five, last_error naming the address and why; with it, it is delivered."""
    w = workers("w1", *FAST, "--webhook-attempts", "5", allow_private=False)
    w.wait_log("public receivers only")
    url = receiver.url.replace("127.0.0.1", "localhost")
    run_id = enqueue_hooked(db, url)
    wait_until(lambda: state(db, run_id) == "dead", 15, "the dead letter")
    row = delivery(db, run_id)
    assert row["attempts"] == 1 and row["last_http_status"] is None
    assert row["last_error"].startswith("webhook_url's host localhost resolves to "), row["last_error"]
    assert "127.0.0.1, a loopback address" in row["last_error"]
    assert "--allow-private-webhooks" in row["last_error"]
    assert receiver.count() == 0
    w.close()

    workers("w2", *FAST)  # the tests' workers allow private receivers
    db.execute("SELECT runrow.retry_webhook_delivery(%s)", (row["id"],))
    wait_until(lambda: state(db, run_id) == "delivered", 15, "the delivery, once allowed")
    assert receiver.count() == 1
