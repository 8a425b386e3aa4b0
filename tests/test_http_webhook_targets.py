"""A user's webhook_url may not point into the operator's network (server-side request forgery).

With `--user-may-set webhook_url` the workers POST a run's ending wherever its user said, from
inside the operator's network: the loopback interface, the private network, the cloud metadata
service at 169.254.169.254. `runrow serve` refuses such a URL with a 422 naming webhook_url,
whether its host is an address or a name resolving to one, unless the operator started it with
--allow-private-webhooks (local development, receivers of their own) or lists the receivers'
networks in --webhook-allow-network, as its workers do. Nothing is written for a refused request.
The check fails closed: a name that does not resolve is a 422, one whose resolver does not answer
in time a 503 with Retry-After, and the look-ups run in threads of their own, so names whose DNS
hangs cannot take asyncio's default pool from the database's reconnects.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from dns_support import fake_dns
from http_support import ALICE, Server, private_database, serve

from pyworker.http import webhook_targets
from pyworker.http.config import ServeConfig
from pyworker.http.errors import ApiError
from pyworker.worker import webhook_transport
from pyworker.worker.public_addresses import why_not_public

NOT_PUBLIC = [
    "http://127.0.0.1:9/hook",
    "https://10.1.2.3/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://[::1]:8080/hook",
    "http://localhost:9/hook",  # a name, resolving to loopback
    "http://93.184.216.34@127.0.0.1/hook",  # the host is 127.0.0.1: userinfo is not the host
    "http://127.1/hook",  # getaddrinfo reads it as 127.0.0.1, and so would the worker's connect
    "http://0.0.0.0/hook",
    "http://[::ffff:169.254.169.254]/hook",
    "http://[fe80::1]/hook",
    "http://[fd00::1]/hook",
    "http://224.0.0.1/hook",
    "http://100.64.0.1/hook",
]


@pytest.fixture(scope="module")
def targets_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_webhook_targets")


@pytest.fixture(scope="module")
def server(targets_db: str) -> Iterator[Server]:
    yield from serve(targets_db, user_may_set=frozenset({"webhook_url"}))


def _enqueue(server: Server, webhook_url: Any) -> httpx.Response:
    with httpx.Client(base_url=server.url, headers=ALICE, timeout=20) as client:
        return client.post(
            f"/conversations/{uuid.uuid4()}/runs", json={"content": "hi", "webhook_url": webhook_url}
        )


def _nxdomain(host: str) -> list[Any]:
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def _runs(db_url: str) -> int:
    with psycopg.connect(db_url) as db:
        row = db.execute("SELECT count(*) FROM runrow.agent_run").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("url", NOT_PUBLIC)
def test_a_webhook_into_the_operators_network_is_a_422_naming_webhook_url(
    server: Server, targets_db: str, url: str
) -> None:
    before = _runs(targets_db)
    refused = _enqueue(server, url)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["type"] == "webhook_url_not_public", error
    assert error["message"].startswith("webhook_url"), error
    assert "--allow-private-webhooks" in error["message"], error
    assert _runs(targets_db) == before


def test_a_public_address_is_taken_without_being_contacted(server: Server, targets_db: str) -> None:
    url = "https://93.184.216.34/hook"
    made = _enqueue(server, url)
    assert made.status_code == 202, made.text
    with psycopg.connect(targets_db) as db:
        stored = db.execute(
            "SELECT webhook_url FROM runrow.agent_run WHERE id = %s", (uuid.UUID(made.json()["run_id"]),)
        ).fetchone()
    assert stored == (url,)


def test_the_operator_may_allow_private_receivers(targets_db: str) -> None:
    for server in serve(targets_db, user_may_set=frozenset({"webhook_url"}), allow_private_webhooks=True):
        for url in ("http://127.0.0.1:9/hook", "http://localhost:9/hook", "http://169.254.169.254/"):
            made = _enqueue(server, url)
            assert made.status_code == 202, (url, made.text)


def test_the_flag_reaches_the_service() -> None:
    from pyworker.cli.main import build_parser
    from pyworker.cli.serve import build_config

    base = ["--database-url", "postgresql://app@primary/app", "serve", "--insecure-dev"]
    assert build_config(build_parser().parse_args(base)).allow_private_webhooks is False
    allowed = build_parser().parse_args([*base, "--allow-private-webhooks"])
    assert build_config(allowed).allow_private_webhooks is True


# The operator's networks: a Kubernetes service network's /16 and an IPv6 ULA /32.
ALLOWED = (ipaddress.ip_network("10.1.0.0/16"), ipaddress.ip_network("fd00:1::/32"))
IN_ALLOWED = [
    "http://10.1.2.3:8080/hook",
    "https://hooks.internal.example/x",  # a name resolving into 10.1.0.0/16
    "https://both.internal.example/x",  # a public answer and one in 10.1.0.0/16
    "http://[fd00:1::5]/hook",
    "http://[::ffff:10.1.2.3]/hook",  # IPv4 spelled as IPv6: judged by the IPv4 it reaches
    "https://93.184.216.34/hook",  # public addresses stay taken
]
OUTSIDE_ALLOWED = [
    "http://10.2.0.1/hook",
    "http://127.0.0.1:9/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00:2::1]/hook",
    "https://other.internal.example/x",  # a name resolving outside them
    "https://mixed.internal.example/x",  # one answer in 10.1.0.0/16, one on loopback
]
INTERNAL_DNS = {
    "hooks.internal.example": ["10.1.2.3"],
    "both.internal.example": ["93.184.216.34", "10.1.9.9"],
    "other.internal.example": ["10.2.0.1"],
    "mixed.internal.example": ["10.1.2.3", "127.0.0.1"],
}


def test_a_receiver_in_an_allowed_network_is_taken_and_others_still_refused(
    targets_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`runrow worker --webhook-allow-network 10.1.0.0/16` delivers to 10.1.2.3, but serve
    had no such flag: a user's webhook_url there was a 422 (or the operator lifted the check for
    every address, the metadata service's included, with --allow-private-webhooks). Now serve
    takes the workers' networks, and every other non-public address is still refused, naming
    both flags and not the networks (which would map the operator's network for any user)."""
    fake_dns(monkeypatch, INTERNAL_DNS)
    for server in serve(targets_db, user_may_set=frozenset({"webhook_url"}), webhook_allow_networks=ALLOWED):
        for url in IN_ALLOWED:
            made = _enqueue(server, url)
            assert made.status_code == 202, (url, made.text)
        before = _runs(targets_db)
        for url in OUTSIDE_ALLOWED:
            refused = _enqueue(server, url)
            assert refused.status_code == 422, (url, refused.text)
            error = refused.json()["error"]
            assert error["type"] == "webhook_url_not_public", error
            assert error["message"].startswith("webhook_url"), error
            assert "--webhook-allow-network" in error["message"], error
            assert "10.1.0.0" not in error["message"] and "fd00:1::" not in error["message"], error
        assert _runs(targets_db) == before


@pytest.mark.parametrize(
    "address",
    [
        "10.1.2.3",
        "10.2.0.1",
        "127.0.0.1",
        "93.184.216.34",
        "fd00:1::5",
        "fd00:2::1",
        "::ffff:10.1.2.3",
        "::ffff:169.254.169.254",
        "2002:a01:203::",  # 6to4 of 10.1.2.3
        "64:ff9b::a01:203",  # NAT64 of 10.1.2.3
        "64:ff9b:1:a01:2:300::",  # a local-use NAT64 address whose IPv4 cannot be told
    ],
)
async def test_enqueue_and_delivery_judge_an_address_alike(address: str) -> None:
    """Serve's check at enqueue and the sender's at delivery refuse the same addresses with the
    same networks allowed: one rule (public_addresses.why_refused), not two that drift."""
    host = f"[{address}]" if ":" in address else address
    try:
        await webhook_targets.refuse_non_public(f"http://{host}/hook", ALLOWED)
        enqueue_refuses = False
    except ApiError as exc:
        assert exc.status == 422, exc
        enqueue_refuses = True
    try:
        webhook_transport._reachable(address, [address], ALLOWED, literal=True)
        sender_refuses = False
    except webhook_transport.NotPublic:
        sender_refuses = True
    assert enqueue_refuses is sender_refuses


def test_the_networks_and_the_variables_reach_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers' flags, from the same definition: --webhook-allow-network (repeatable, comma-
    separated, each network once) and both variables, which serve did not read."""
    from pyworker.cli.main import build_parser
    from pyworker.cli.serve import build_config

    base = ["--database-url", "postgresql://app@primary/app", "serve", "--insecure-dev"]
    config = build_config(build_parser().parse_args(base))
    assert config.webhook_allow_networks == () and config.allow_private_webhooks is False
    flags = [
        *base,
        "--webhook-allow-network",
        "10.1.0.0/16",
        "--webhook-allow-network",
        "fd00:1::/32,10.1.0.0/16",
    ]
    assert build_config(build_parser().parse_args(flags)).webhook_allow_networks == ALLOWED
    monkeypatch.setenv("RUNROW_WEBHOOK_ALLOW_NETWORKS", "10.1.0.0/16,fd00:1::/32")
    monkeypatch.setenv("RUNROW_ALLOW_PRIVATE_WEBHOOKS", "1")
    config = build_config(build_parser().parse_args(base))
    # The networks come from the variable; serve's allow-everything never does (a flag only).
    assert config.webhook_allow_networks == ALLOWED and config.allow_private_webhooks is False
    assert build_config(build_parser().parse_args([*base, "--allow-private-webhooks"])).allow_private_webhooks
    flagged = build_parser().parse_args([*base, "--webhook-allow-network", "172.17.0.0/16"])
    assert build_config(flagged).webhook_allow_networks == (ipaddress.ip_network("172.17.0.0/16"),)


def test_networks_given_in_code_are_checked_at_construction() -> None:
    """Strings would make every webhook_url enqueue a 500 (`in` a str), not a refusal to start."""
    with pytest.raises(ValueError, match="webhook_allow_networks must be a tuple of ipaddress networks"):
        ServeConfig(database_url="postgresql:///x", model="m", webhook_allow_networks=["10.0.0.0/8"])  # type: ignore[arg-type]


async def test_one_private_answer_among_public_ones_refuses_the_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name with several addresses is refused if any is not public: the worker's connect may
    take any of them."""

    def answers(host: str) -> list[Any]:
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", 0)),
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fe80::1%eth0", 0, 0, 2)),
        ]

    fake_dns(monkeypatch, {"hooks.example.com": answers})
    with pytest.raises(ApiError) as refused:
        await webhook_targets.refuse_non_public("https://hooks.example.com/x")
    assert refused.value.status == 422
    assert "resolves to fe80::1, a link-local address" in refused.value.message


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("93.184.216.34", True),
        ("2606:2800:220:1:248:1893:25c8:1946", True),
        ("64:ff9b::5db8:d822", True),  # NAT64 of 93.184.216.34: public behind DNS64
        ("64:ff9b::7f00:1", False),  # NAT64 of 127.0.0.1
        # RFC 8215's local-use prefix, a /96 of it a network's own: judged as 64:ff9b::/96
        ("64:ff9b:1::5db8:d822", True),
        ("64:ff9b:1:abcd::5db8:d822", True),
        ("64:ff9b:1::7f00:1", False),
        ("64:ff9b:1:abcd::a9fe:a9fe", False),  # 169.254.169.254
        ("64:ff9b:1::a00:1", False),
        # Other RFC 6052 layouts in the local-use prefix put the IPv4 elsewhere: refused, as
        # their last 32 bits are not the address reached (169.254.169.254 in the /48 layout).
        ("64:ff9b:1:a9fe:a9:fe00:5db8:d822", False),
        ("64:ff9b:1:a9:fe:a9fe:5db8:d822", False),  # /56 layout
        ("64:ff9b:1:0:a:0:15d:b8d8", False),  # /64 layout of 10.0.0.1
        ("64:ff9b:1::1:5db8:d822", False),  # bits 64-95 not zero
        ("2002:a00:1::", False),  # 6to4 of 10.0.0.1
        ("::ffff:10.0.0.1", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("fc00::1", False),
        ("fec0::1", False),
        ("::", False),
        ("ff02::1", False),
        ("240.0.0.1", False),
    ],
)
def test_which_addresses_are_public(address: str, public: bool) -> None:
    assert (why_not_public(ipaddress.ip_address(address)) is None) is public


def test_a_name_that_does_not_resolve_is_a_422_naming_webhook_url(
    server: Server, targets_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not let through: it could resolve to a private address by delivery, unchecked."""
    fake_dns(monkeypatch, {"hooks.nowhere.example": _nxdomain})
    before = _runs(targets_db)
    refused = _enqueue(server, "https://hooks.nowhere.example/x")
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["type"] == "webhook_url_unresolvable", error
    assert error["message"].startswith("webhook_url's host hooks.nowhere.example does not resolve"), error
    assert _runs(targets_db) == before


def test_a_resolver_that_does_not_answer_is_a_503_to_repeat(
    server: Server, targets_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()

    def hang(host: str) -> list[Any]:
        release.wait(30)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    fake_dns(monkeypatch, {"hooks.slow.example": hang})
    monkeypatch.setattr(webhook_targets, "RESOLVE_TIMEOUT", 0.5)
    before = _runs(targets_db)
    try:
        slow = _enqueue(server, "https://hooks.slow.example/x")
    finally:
        release.set()
    assert slow.status_code == 503, slow.text
    assert slow.headers["Retry-After"] == webhook_targets.RETRY_AFTER
    error = slow.json()["error"]
    assert error["type"] == "webhook_url_lookup_unavailable", error
    assert "hooks.slow.example" in error["message"], error
    assert _runs(targets_db) == before


async def test_look_ups_that_hang_leave_asyncios_pool_to_the_database(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More hanging look-ups than asyncio's default pool has threads (6 on 2 cores): psycopg's
    reconnects resolve the database's host in that pool, and must still get an answer."""
    calls = min(32, (os.cpu_count() or 1) + 4) + 4
    release = threading.Event()

    def hang(host: str) -> list[Any]:
        release.wait(30)  # the resolver's own timeout, long past the request's
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    fake_dns(monkeypatch, {f"hook{i}.slow.example": hang for i in range(calls)})
    monkeypatch.setattr(webhook_targets, "RESOLVE_TIMEOUT", 0.3)
    try:
        outcomes = await asyncio.gather(
            *(webhook_targets.refuse_non_public(f"https://hook{i}.slow.example/x") for i in range(calls)),
            return_exceptions=True,
        )
        # What psycopg's async connect does first with the database's host name.
        started = time.monotonic()
        try:
            answers: Any = await asyncio.wait_for(
                asyncio.get_running_loop().getaddrinfo("localhost", 5432), 3
            )
        except TimeoutError as exc:
            answers = exc
        waited = time.monotonic() - started
    finally:
        release.set()
    assert isinstance(answers, list) and answers, f"localhost did not resolve in {waited:.1f} s: {answers!r}"
    for outcome in outcomes:
        assert isinstance(outcome, ApiError) and outcome.status == 503, outcome
        assert outcome.headers == {"Retry-After": webhook_targets.RETRY_AFTER}


async def test_a_name_without_addresses_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dns(monkeypatch, {"hooks.empty.example": lambda host: []})
    with pytest.raises(ApiError) as refused:
        await webhook_targets.refuse_non_public("https://hooks.empty.example/x")
    assert (refused.value.status, refused.value.type) == (422, "webhook_url_unresolvable")


@pytest.mark.parametrize("url", ["https://exa mple.test/", "https://a%2e127.0.0.1/", "https://host!name/"])
def test_a_host_that_is_not_a_host_name_is_refused_not_passed_on(
    server: Server, targets_db: str, url: str
) -> None:
    """A host no resolver should be asked about (httpx reads `exa mple.test` as `exa%20mple.test`)
    is a 400 naming webhook_url, never let through unresolved to a delivery."""
    before = _runs(targets_db)
    refused = _enqueue(server, url)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["message"].startswith("webhook_url"), refused.text
    assert _runs(targets_db) == before
