"""The webhook sender's HTTP client, whose host look-ups run in threads of its own.

httpx connects through anyio, which looks a host name up with loop.getaddrinfo: in asyncio's
default pool (6 threads on 2 cores), shared with psycopg's reconnects and the Anthropic SDK
(pyworker/db/threads.py). A receiver whose nameserver stopped answering held a thread per
attempt for the resolver's own timeout, long after the attempt's 10 s ended: an unrelated
look-up afterwards waited 28 s, and at exit asyncio.run waited 30 s for those threads (the
webhooks audit). Here the name is looked up in a daemon thread of its own, at most
MAX_LOOKUPS at once, and the connection is opened to the address found. Only the TCP connect
changes: the request still names the host, so the Host header, TLS SNI and the certificate
check are those of the webhook_url (or of the proxy, which resolves the receiver itself).

Resolving here also lets the sender see every address it is about to connect to: unless the
worker allows private receivers (--allow-private-webhooks), each must be public or in a network
the operator allowed (--webhook-allow-network), judged by public_addresses.why_refused as `runrow
serve` judged it at enqueue, so a user's name that `runrow serve` saw resolve to a public address
and that answers 127.0.0.1 or 169.254.169.254 at delivery (DNS rebinding) is not reached. The
other addresses are left out; a host with none left is NotPublic.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

from pyworker.db.threads import in_own_thread
from pyworker.worker.public_addresses import IPNetwork, why_refused

# Look-ups in flight at once, the ones still running after their attempt ended included: a
# nameserver that never answers costs at most this many threads, and the attempts beyond it
# fail at once (retried with backoff) rather than adding threads.
MAX_LOOKUPS = 32
# After this long without an answer from one address, the next is tried beside it (RFC 8305's
# connection attempt delay, as anyio's connect_tcp does for a name): one by one, a first address
# that drops packets (an AAAA record on a network without IPv6, a dead IP behind a balancer) took
# the whole connect timeout, which is also the attempt's, and the delivery was dead-lettered with
# the receiver reachable at its second address (the final review of c62868f).
STAGGER_SECONDS = 0.25
# A connect failing so leaves the next address to try, as a connect to the name would.
_NEXT_ADDRESS = (httpcore.ConnectError, httpcore.ConnectTimeout)


class NotPublic(Exception):
    """The receiver's host is, or resolves only to, addresses a webhook must not reach (loopback,
    private, link-local, ...): no connection was opened. The message names each address and why.
    Not an httpcore error, so httpx passes it through as it is, not as a ConnectError.

    `literal`: the host is an address, which no later attempt finds otherwise (a deterministic
    failure). A name's answer may change (split-horizon DNS, a sinkhole lifted, a record fixed),
    as a name that does not resolve may come to: such an attempt failed, and is retried."""

    def __init__(self, message: str, *, literal: bool) -> None:
        super().__init__(message)
        self.literal = literal


class ResolvingBackend(httpcore.AsyncNetworkBackend):
    """`inner`, with each host name looked up in a thread of its own before the TCP connect;
    with public_only, connecting to public addresses only, and to those in `allowed_networks`."""

    def __init__(
        self,
        inner: httpcore.AsyncNetworkBackend,
        max_lookups: int = MAX_LOOKUPS,
        *,
        public_only: bool = False,
        allowed_networks: Iterable[IPNetwork] = (),
    ) -> None:
        self._inner = inner
        self._lookups = threading.BoundedSemaphore(max_lookups)
        self._max_lookups = max_lookups
        self._public_only = public_only
        self._allowed_networks = tuple(allowed_networks)

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        literal = _numeric(host, port)
        addresses = literal if literal is not None else await self._resolve(host, port)
        if self._public_only:
            addresses = _reachable(host, addresses, self._allowed_networks, literal=literal is not None)
        return await self._first_to_connect(addresses, port, timeout, local_address, socket_options)

    async def _first_to_connect(
        self,
        addresses: list[str],
        port: int,
        timeout: float | None,  # noqa: ASYNC109 (httpcore's signature)
        local_address: str | None,
        socket_options: Iterable[Any] | None,
    ) -> httpcore.AsyncNetworkStream:
        """The first address to connect, each next one started STAGGER_SECONDS after the one
        before (or at once when it failed); the others are cancelled, and closed if they
        connected too."""
        waiting = list(addresses)
        pending: set[asyncio.Task[httpcore.AsyncNetworkStream]] = set()
        error: BaseException | None = None
        try:
            while waiting or pending:
                if waiting:
                    connect = self._inner.connect_tcp(
                        waiting.pop(0), port, timeout, local_address, socket_options
                    )
                    pending.add(asyncio.ensure_future(connect))
                done, pending = await asyncio.wait(
                    pending, timeout=STAGGER_SECONDS if waiting else None, return_when=asyncio.FIRST_COMPLETED
                )
                connected = [t for t in done if t.exception() is None]
                for task in done:
                    exc = task.exception()
                    if exc is not None and not isinstance(exc, _NEXT_ADDRESS):
                        for other in connected:
                            await other.result().aclose()
                        raise exc
                    error = exc or error
                if connected:
                    for other in connected[1:]:
                        await other.result().aclose()
                    return connected[0].result()
        finally:
            await _cancel_and_close(pending)
        assert error is not None
        raise error

    async def _resolve(self, host: str, port: int) -> list[str]:
        if not self._lookups.acquire(blocking=False):
            raise httpcore.ConnectError(
                f"{self._max_lookups} look-ups of webhook hosts already wait for DNS; "
                f"{host} was not looked up"
            )

        def lookup() -> list[Any]:
            try:
                return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            finally:
                self._lookups.release()  # when the thread ends, not when the attempt does

        try:
            infos = await in_own_thread(lookup)
        except OSError as exc:  # what anyio's connect raised (httpcore maps it the same way)
            raise httpcore.ConnectError(str(exc)) from exc
        addresses = _addresses(infos)
        if not addresses:
            raise httpcore.ConnectError(f"{host} has no IPv4 or IPv6 address")
        return addresses

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return await self._inner.connect_unix_socket(path, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _numeric(host: str, port: int) -> list[str] | None:
    """The address `host` spells, or None for a name. Not ipaddress.ip_address alone: httpx passes
    127.1, 2130706433 and 0x7f.0.0.1 through as hosts, which the connect reads as 127.0.0.1 (and
    a refusal of one is as deterministic as of 127.0.0.1: dead-lettered, not retried). Called on
    the event loop: with AI_NUMERICHOST getaddrinfo only parses the text (inet_aton, inet_pton)
    and never asks a resolver, so it cannot block."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except (OSError, UnicodeError):
        return None
    return _addresses(infos) or None


def _addresses(infos: list[Any]) -> list[str]:
    """getaddrinfo's IPv4 and IPv6 addresses, once each, in its order."""
    ip_families = (socket.AF_INET, socket.AF_INET6)
    return list(dict.fromkeys(str(sockaddr[0]) for family, *_, sockaddr in infos if family in ip_families))


def _reachable(
    host: str, addresses: list[str], allowed_networks: tuple[IPNetwork, ...], *, literal: bool
) -> list[str]:
    """The ones of `addresses` (host's, as resolved, or the one it spells when `literal`) that are
    public or in an allowed network, in their order; NotPublic when there is none. The others are
    left out, never tried: a name answering both a public and a private address reaches only the
    public one."""
    reachable: list[str] = []
    refused: list[tuple[str, str]] = []
    for address in addresses:
        reason = why_refused(ipaddress.ip_address(address.split("%", 1)[0]), allowed_networks)
        if reason is None:
            reachable.append(address)
        else:
            refused.append((address, reason))
    if reachable:
        return reachable
    if literal:
        where = f"is {refused[0][1]}"
    else:
        where = "resolves to " + "; ".join(f"{address}, {reason}" for address, reason in refused)
    raise NotPublic(
        f"webhook_url's host {host} {where}: the sender connects to public addresses only "
        "(runrow worker --webhook-allow-network CIDR lets it reach a network of yours, "
        "--allow-private-webhooks any)",
        literal=literal,
    )


async def _cancel_and_close(tasks: set[asyncio.Task[httpcore.AsyncNetworkStream]]) -> None:
    """The connects still running once one won (or the attempt ended): cancelled, and a stream
    one of them opened meanwhile closed, not left to the garbage collector."""
    for task in tasks:
        task.cancel()
    for outcome in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(outcome, httpcore.AsyncNetworkStream):
            await outcome.aclose()


def sender_client(
    timeout: float,
    user_agent: str,
    proxy: str | None,
    *,
    allow_private: bool,
    allowed_networks: Iterable[IPNetwork] = (),
) -> httpx.AsyncClient:
    """The client webhook_loop sends with: no redirects followed, no environment read (an egress
    proxy is `proxy` or none), host look-ups in ResolvingBackend's threads, which connect to
    public addresses and those in `allowed_networks` only, unless `allow_private`. Through a
    proxy, the connection is to the proxy (an address of the operator's choosing, private as a
    rule) and the proxy resolves and reaches the receiver: its egress policy is the check then."""
    transport = httpx.AsyncHTTPTransport(proxy=proxy, trust_env=False)
    # httpx takes no network backend, so it is set on the pool it built; checked here so an
    # httpx that renames it fails at the sender's start, not by silently resolving in the pool.
    pool = transport._pool
    if not isinstance(getattr(pool, "_network_backend", None), httpcore.AsyncNetworkBackend):
        raise RuntimeError(f"httpx {httpx.__version__}: cannot set the webhook sender's network backend")
    pool._network_backend = ResolvingBackend(  # type: ignore[union-attr]
        pool._network_backend,
        public_only=not allow_private and proxy is None,
        allowed_networks=allowed_networks,
    )
    return httpx.AsyncClient(
        timeout=timeout,
        follow_redirects=False,
        headers={"User-Agent": user_agent},
        trust_env=False,
        transport=transport,
    )
