"""The webhook sender connects to public addresses only, unless the worker allows private ones.

`runrow serve` checks a user's webhook_url when it takes the request; a name answering a public
address then and 127.0.0.1 or 169.254.169.254 at delivery (DNS rebinding) had the workers POST
into the operator's network. The sender resolves hosts itself (ResolvingBackend), so it checks
every address it is about to connect to: the non-public ones are never tried, and a host with no
public one gets nothing, its last_error naming each address and why. An IP address as the host
is dead-lettered on that attempt (a deterministic failure); a name is retried, since its answer
may change. `runrow worker --webhook-allow-network CIDR` lets it reach the networks listed,
`--allow-private-webhooks` every address (receivers of one's own).
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpcore
import psycopg
import pytest
from dns_support import fake_dns
from test_webhooks import FAST, Receiver, delivery, enqueue_hooked, receiver, state, workers
from worker_support import db, wait_until, worker_db, worker_db_superuser

from pyworker.worker.webhook_transport import NotPublic, ResolvingBackend, sender_client

__all__ = ["db", "receiver", "worker_db", "worker_db_superuser", "workers"]

NAME = "rebound.example"
LINK_LOCAL = "a link-local address (the cloud metadata service among them)"
HINT = (
    "the sender connects to public addresses only (runrow worker --webhook-allow-network CIDR "
    "lets it reach a network of yours, --allow-private-webhooks any)"
)


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
    fake_dns(monkeypatch, {NAME: addresses})
    inner = Recording()
    with pytest.raises(NotPublic) as refused:
        await ResolvingBackend(inner, public_only=True).connect_tcp(NAME, 443)
    assert inner.tried == []
    assert str(refused.value) == f"webhook_url's host {NAME} resolves to {why}: {HINT}"
    assert not refused.value.literal  # a name's answer may change: the attempt is retried


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("127.0.0.1", "a loopback address"),
        ("::ffff:169.254.169.254", "a link-local address"),
        # Spellings httpx passes through as hosts, which the connect reads as 127.0.0.1: an
        # address too, refused the same at every attempt, not a name to retry.
        ("127.1", "a loopback address"),
        ("2130706433", "a loopback address"),
        ("0x7f.0.0.1", "a loopback address"),
        ("0xa9fea9fe", "a link-local address"),
    ],
)
async def test_an_address_as_the_host_is_checked_too(host: str, why: str) -> None:
    inner = Recording()
    with pytest.raises(NotPublic, match=f"^webhook_url's host {host} is {why}") as refused:
        await ResolvingBackend(inner, public_only=True).connect_tcp(host, 80)
    assert inner.tried == []
    assert refused.value.literal  # the same at every attempt: dead-lettered on this one


async def test_the_allowed_networks_are_reached_and_no_other_non_public_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--webhook-allow-network: addresses in a listed network are tried (an IPv4-mapped one by
    the IPv4 address it reaches); every other non-public one is still left out, and a host with
    none left is refused as before."""
    allowed = [ipaddress.ip_network("10.96.0.0/12"), ipaddress.ip_network("fd00:1::/32")]
    answer = ["10.96.0.10", "192.168.1.1", "::ffff:10.96.0.11", "fd00:1::5", "fd00:2::5", "169.254.169.254"]
    fake_dns(monkeypatch, {NAME: answer})
    inner = Recording()
    with pytest.raises(httpcore.ConnectError):
        await ResolvingBackend(inner, public_only=True, allowed_networks=allowed).connect_tcp(NAME, 443)
    assert sorted(inner.tried) == ["10.96.0.10", "::ffff:10.96.0.11", "fd00:1::5"]
    for host, why in (("10.95.255.255", "a private address"), ("127.0.0.1", "a loopback address")):
        with pytest.raises(NotPublic, match=f"^webhook_url's host {host} is {why}"):
            await ResolvingBackend(inner, public_only=True, allowed_networks=allowed).connect_tcp(host, 80)
    assert len(inner.tried) == 3


@pytest.mark.parametrize(
    ("allowed", "host"),
    [
        ("::ffff:0:0/96", "::ffff:169.254.169.254"),  # IPv4-mapped
        ("2002::/16", "2002:a9fe:a9fe::"),  # 6to4
        ("64:ff9b::/96", "64:ff9b::a9fe:a9fe"),  # NAT64, well-known prefix
        ("64:ff9b:1::/48", "64:ff9b:1::a9fe:a9fe"),  # NAT64, local-use /96 layout
        ("64:ff9b:1::/48", "64:ff9b:1:a9fe:a9:fe00:5db8:d822"),  # /48 layout: an IPv4 unknown
    ],
)
async def test_an_allowed_ipv6_network_does_not_allow_the_ipv4_addresses_it_spells(
    monkeypatch: pytest.MonkeyPatch, allowed: str, host: str
) -> None:
    """An address spelling an IPv4 one is allowed by the network of the IPv4 address it reaches,
    never by its IPv6 form: listing ::ffff:0:0/96 or 2002::/16 does not reach 169.254.169.254.
    Its own IPv4 network still allows it."""
    inner = Recording()
    backend = ResolvingBackend(inner, public_only=True, allowed_networks=[ipaddress.ip_network(allowed)])
    with pytest.raises(NotPublic, match=f"^webhook_url's host {re.escape(host)} is "):
        await backend.connect_tcp(host, 80)
    assert inner.tried == []
    if host != "64:ff9b:1:a9fe:a9:fe00:5db8:d822":
        backend = ResolvingBackend(
            inner, public_only=True, allowed_networks=[ipaddress.ip_network("169.254.169.254/32")]
        )
        with pytest.raises(httpcore.ConnectError):
            await backend.connect_tcp(host, 80)
        assert inner.tried == [host]


async def test_only_the_public_addresses_of_a_name_are_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dns(monkeypatch, {NAME: ["10.0.0.1", "93.184.216.34", "::1", "2606:2800:220:1:248:1893:25c8:1946"]})
    inner = Recording()
    with pytest.raises(httpcore.ConnectError):
        await ResolvingBackend(inner, public_only=True).connect_tcp(NAME, 443)
    assert sorted(inner.tried) == ["2606:2800:220:1:248:1893:25c8:1946", "93.184.216.34"]


async def test_without_the_check_every_address_is_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dns(monkeypatch, {NAME: ["127.0.0.1"]})
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
    fake_dns(monkeypatch, {NAME: ["127.0.0.1"]})
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


def _readme_rearm_sql() -> str:
    """The README's statement that re-arms, in bulk, the deliveries refused as not public."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    blocks = re.findall(r"```sql\n(.*?)```", readme, re.S)
    found = [b for b in blocks if "retry_webhook_delivery" in b and "public addresses only" in b]
    assert len(found) == 1, "README has no single SQL example re-arming the deliveries refused as not public"
    return found[0]


def _rearm_as_auditor_and_client(superuser_url: str) -> list[Any]:
    """The README's bulk re-arm, run as a role holding runrow_auditor and runrow_client only
    (what the README says it takes), made for the test and dropped after."""
    role = f"rearm_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(superuser_url, autocommit=True) as su:
        su.execute(f"CREATE ROLE {role} NOLOGIN IN ROLE runrow_auditor, runrow_client")
        try:
            with su.transaction():
                su.execute(f"SET LOCAL ROLE {role}")
                return su.execute(_readme_rearm_sql()).fetchall()
        finally:
            su.execute(f"DROP ROLE {role}")


def test_a_worker_dead_letters_an_address_that_is_not_public_at_once_naming_it(
    db: psycopg.Connection, receiver: Receiver, workers: Any, worker_db_superuser: str
) -> None:
    """An IP address as the host is refused the same way at every attempt: without
    --allow-private-webhooks the worker sends it nothing and the delivery ends on its first
    attempt of five, last_error naming the address and why. A worker that lists its network
    (--webhook-allow-network) delivers it once the README's bulk re-arm re-arms it."""
    w = workers("w1", *FAST, "--webhook-attempts", "5", allow_private=False)
    w.wait_log("public receivers only")
    run_id = enqueue_hooked(db, receiver.url)
    wait_until(lambda: state(db, run_id) == "dead", 15, "the dead letter")
    row = delivery(db, run_id)
    assert row["attempts"] == 1 and row["last_http_status"] is None
    assert row["last_error"] == f"webhook_url's host 127.0.0.1 is a loopback address: {HINT}"
    assert receiver.count() == 0
    w.close()

    w = workers("w2", *FAST, "--webhook-allow-network", "127.0.0.0/8", allow_private=False)
    w.wait_log("public receivers and 127.0.0.0/8")
    assert _rearm_as_auditor_and_client(worker_db_superuser) == [(True,)]
    wait_until(lambda: state(db, run_id) == "delivered", 15, "the delivery, once allowed")
    assert receiver.count() == 1


def test_a_worker_retries_a_name_that_resolves_only_to_addresses_that_are_not_public(
    db: psycopg.Connection, receiver: Receiver, workers: Any
) -> None:
    """Through the real resolver: `localhost` is 127.0.0.1 or ::1 (or both), on loopback. A name's
    answer may change (split horizon, a sinkhole lifted), as a name that does not resolve may
    come to: each attempt fails, nothing sent, and the delivery is retried until its attempts
    run out, last_error naming the addresses and why; with --allow-private-webhooks it is
    delivered."""
    w = workers("w1", *FAST, "--webhook-attempts", "2", allow_private=False)
    w.wait_log("public receivers only")
    url = receiver.url.replace("127.0.0.1", "localhost")
    run_id = enqueue_hooked(db, url)
    wait_until(lambda: state(db, run_id) == "dead", 15, "the dead letter after the retry")
    row = delivery(db, run_id)
    assert row["attempts"] == 2 and row["last_http_status"] is None
    assert row["last_error"].startswith("webhook_url's host localhost resolves to "), row["last_error"]
    assert "a loopback address" in row["last_error"] and row["last_error"].endswith(HINT)
    assert receiver.count() == 0
    w.close()

    workers("w2", *FAST)  # the tests' workers allow private receivers
    db.execute("SELECT runrow.retry_webhook_delivery(%s)", (row["id"],))
    wait_until(lambda: state(db, run_id) == "delivered", 15, "the delivery, once allowed")
    assert receiver.count() == 1
