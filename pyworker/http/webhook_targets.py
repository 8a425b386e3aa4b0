"""Where a user's webhook may point: public addresses, and the networks the operator allowed
(`runrow serve --webhook-allow-network`, the workers' flag), unless it allows every address.

The workers POST a run's ending to its webhook_url from inside the operator's network, so a
user who may set that URL could otherwise make them request the loopback interface, the
private network or the cloud metadata service (169.254.169.254): server-side request forgery.
An address is judged by public_addresses.why_refused, the sender's own rule, with the networks
serve was given: a fleet whose workers and service take the same flags (or variables) refuses
at enqueue what its workers would refuse at delivery, and nothing they would reach.
The check here is made when the service takes the request; a name that resolves to a public
address now and a private one at delivery (DNS rebinding) is caught by the workers' sender,
which checks every address it connects to again (pyworker/worker/webhook_transport.py). It
fails closed: a name that does not resolve is refused (422), and one whose resolver does not
answer in time is a 503 to repeat, never let through. Operators (SQL, `runrow enqueue`) are
trusted and never pass through here.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
import threading
from typing import Any

import httpx

from pyworker.db.aio import within
from pyworker.db.threads import in_own_thread
from pyworker.http.errors import ApiError
from pyworker.worker.public_addresses import IPAddress, IPNetwork, why_refused

log = logging.getLogger("runrow.http")

# What may be looked up: letters, digits, hyphens, underscores (container names) and dots (IDNA
# names arrive as xn-- ASCII).
HOST_NAME = re.compile(r"[A-Za-z0-9._-]{1,253}")
# A resolver that hangs must not hold the request: past this it is a 503 to repeat, never a
# name let through unchecked (that would let a user pass any name by making its DNS slow).
RESOLVE_TIMEOUT = 5.0
# Look-ups whose thread has not returned yet, the ones callers gave up on included (a resolver
# that never answers keeps each for its own timeout, about 30 s): one thread each, so a user
# posting names whose DNS hangs must not make them without bound. Past this, a 503 to repeat.
MAX_LOOKUPS = 64
_lookups = threading.BoundedSemaphore(MAX_LOOKUPS)
# Seconds a client should wait before repeating a request that met a slow resolver.
RETRY_AFTER = "5"
# getaddrinfo's answers for a resolver that could not answer now (a timeout, SERVFAIL): temporary.
_TEMPORARY = {socket.EAI_AGAIN}


async def refuse_non_public(url: str, allowed: tuple[IPNetwork, ...] = ()) -> None:
    """A 422 naming webhook_url when its host is, or resolves to, an address that is neither
    public nor in an `allowed` network, or does not resolve at all; a 503 with Retry-After when
    its resolver does not answer in time.

    The host is read by httpx, the client the workers send with, so both see the same host
    (`http://a@127.0.0.1/` is 127.0.0.1 to both). A URL httpx cannot read is left to
    enqueue_run's own rules: no request can be sent to it. A name that does not resolve is
    refused, not let through: it could be made to resolve to a private address before delivery,
    which no check at enqueue sees.
    """
    try:
        parsed = httpx.URL(url)
        host = parsed.raw_host.decode("ascii")
    except (httpx.InvalidURL, UnicodeError):
        return
    if parsed.scheme not in ("http", "https"):
        return  # enqueue_run refuses it, naming the scheme: no request is ever sent to it
    if not host:
        return
    try:
        literal: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        reason = why_refused(literal, allowed)
        if reason is not None:
            raise _refused(f"webhook_url's host {host} is {reason}")
        return
    if not HOST_NAME.fullmatch(host):
        # Not a host name (a space, a percent sign): refused here, never passed on unresolved.
        raise ApiError(400, "invalid_request", f"webhook_url's host {host!r} is not a host name")
    # Names, and the numeric spellings getaddrinfo reads as IPv4 (127.1, 0x7f.1, 2130706433).
    addresses = await _resolve(host)
    if not addresses:
        raise _unresolvable(host, "no IPv4 or IPv6 address")
    for address in addresses:
        reason = why_refused(address, allowed)
        if reason is not None:
            raise _refused(f"webhook_url's host {host} resolves to {address}, {reason}")


async def _resolve(host: str) -> list[IPAddress]:
    if not _lookups.acquire(blocking=False):
        log.warning("webhook_url host %r: %d look-ups already wait for DNS; answered 503", host, MAX_LOOKUPS)
        raise _unavailable(f"too many webhook_url host look-ups wait for DNS; {host} was not looked up")

    def lookup() -> list[Any]:
        try:
            return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        finally:
            _lookups.release()  # when the thread ends, not when the caller stops waiting

    # In a thread of its own, not loop.getaddrinfo: asyncio's default pool (6 threads on 2
    # cores) also resolves the database's host for psycopg's reconnects, and a look-up that
    # hangs holds its thread for the resolver's own timeout, long past ours.
    try:
        infos = await within(in_own_thread(lookup), RESOLVE_TIMEOUT)
    except socket.gaierror as exc:
        if exc.errno in _TEMPORARY:
            raise _unavailable(
                f"the resolver could not look webhook_url's host {host} up now ({exc})"
            ) from exc
        raise _unresolvable(host, str(exc)) from exc
    except (OSError, UnicodeError) as exc:
        raise _unresolvable(host, str(exc)) from exc
    if infos is None:
        raise _unavailable(
            f"the resolver did not answer for webhook_url's host {host} in {RESOLVE_TIMEOUT:g} s"
        )
    addresses: list[IPAddress] = []
    for family, _type, _proto, _name, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            # An IPv6 link-local answer may carry a zone ("fe80::1%eth0").
            addresses.append(ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]))
    return addresses


def _refused(what: str) -> ApiError:
    return ApiError(
        422,
        "webhook_url_not_public",
        # The allowed networks are not named: they map the operator's network for any user.
        f"{what}: this service sends webhooks only to public addresses and the networks its "
        "operator allowed (an operator who runs receivers on a private network starts runrow "
        "serve and the workers with --webhook-allow-network CIDR, or --allow-private-webhooks)",
    )


def _unresolvable(host: str, why: str) -> ApiError:
    # Not let through: a name that resolves to nothing now may resolve to a private address at
    # delivery, and the check here is the only one the workers' requests get.
    return ApiError(
        422,
        "webhook_url_unresolvable",
        f"webhook_url's host {host} does not resolve ({why}): this service sends webhooks only to "
        "names that resolve to public addresses",
    )


def _unavailable(what: str) -> ApiError:
    return ApiError(
        503, "webhook_url_lookup_unavailable", f"{what}; retry shortly", {"Retry-After": RETRY_AFTER}
    )
