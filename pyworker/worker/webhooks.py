"""Webhook delivery: every worker that has a secret drains the outbox (runrow.webhook_delivery).

The database decides everything that must survive a crash: which deliveries are due, who holds
one (a lease, so a worker killed mid-request loses nothing: the next claim after the lease takes
it over, same delivery id), the backoff and the dead letter. This loop only sends the POST and
reports what the receiver said. Delivery is at least once: a receiver deduplicates on the
Runrow-Delivery-Id header (also the body's "id").

Signing follows Stripe's scheme so receivers can reuse what they know (webhook_signing):
    Runrow-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(key, "<t>.<raw body>")>[,v1=...]
t is the database clock at the claim; one v1 per key of WebhookSettings.keys_for: the fleet
secret, the key derived from it for the body's user_id, or both, and the same again from the
previous secret during a rotation. verify_signature() is the receiver's side. The secrets are the
worker's configuration (--webhook-secret / RUNROW_WEBHOOK_SECRET, --webhook-previous-secret),
never stored in the database, nor are the users' keys: whoever can read the tables cannot forge
a webhook.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx
from psycopg_pool import AsyncConnectionPool

from pyworker.db import channels, claimed_json
from pyworker.db.aio import within
from pyworker.db.hub import Hub
from pyworker.db.webhooks import (
    Delivery,
    claim_webhook_deliveries,
    complete_webhook_delivery,
    fail_webhook_delivery,
)
from pyworker.worker import exact_json, metrics
from pyworker.worker.public_addresses import IPNetwork
from pyworker.worker.settings import (
    DEFAULT_WEBHOOK_PER_RECEIVER,
    DEFAULT_WEBHOOK_SIGNING,
    WEBHOOK_SIGNING_MODES,
)
from pyworker.worker.settings import check as check_setting

# The receiver's side lives in webhook_signing (no HTTP client to import); re-exported here,
# where receivers imported it from before.
from pyworker.worker.webhook_signing import DEFAULT_TOLERANCE as DEFAULT_TOLERANCE
from pyworker.worker.webhook_signing import SIGNATURE_HEADER, derive_user_secret, signature_header
from pyworker.worker.webhook_signing import SignatureError as SignatureError
from pyworker.worker.webhook_signing import verify_signature as verify_signature
from pyworker.worker.webhook_transport import NotPublic, sender_client

log = logging.getLogger("runrow.webhooks")

DELIVERY_HEADER = "Runrow-Delivery-Id"
ATTEMPT_HEADER = "Runrow-Delivery-Attempt"
USER_AGENT = "runrow-webhooks/1"
# Below this many characters a fleet secret that users' keys are derived from is warned of: 32
# hex digits are 128 random bits (README "Webhooks").
MIN_SECRET_FOR_USER_KEYS = 32


def encode_body(payload: dict[str, Any]) -> bytes:
    """The JSON body: compact, keys sorted, UTF-8, so every attempt sends the same bytes; a
    number read by exact_json.loads is written as the database printed it."""
    return exact_json.dumps(payload).encode()


def body_of(payload_json: str) -> bytes:
    """The body of a delivery whose payload the database sent as `payload_json`: encode_body's
    form, or, for a payload that form cannot carry faithfully, the database's own JSON text
    (which says the same thing). Such a payload was written before migration 0069 made the
    table refuse it: nested deeper than Python decodes, or an integer of more digits than Python
    reads (4,300). Numbers are never read as floats (exact_json): a result's
    12345678901234567.89 went out as 1.2345678901234568e+16, and 1e400 as `Infinity`."""
    return body_and_user(payload_json)[0]


class Unreadable:
    """A payload's user_id that could not be read: no user's key can sign that delivery."""

    def __init__(self, why: str) -> None:
        self.why = why


def body_and_user(payload_json: str) -> tuple[bytes, object]:
    """body_of's body, and the "user_id" it carries, read from the same text: a str, None when
    null or absent, whatever else a hand-written payload holds, or Unreadable. The user's key
    must be the one of the user_id the receiver reads in the body, byte for byte."""
    try:
        value = exact_json.loads(payload_json)
    except (ValueError, RecursionError):
        try:
            user = claimed_json.top_level_member(payload_json, "user_id")
        except ValueError as exc:
            user = Unreadable(str(exc))
        return payload_json.encode(), user
    user = value.get("user_id") if isinstance(value, dict) else None
    try:
        return encode_body(value), user
    except (ValueError, RecursionError):
        return payload_json.encode(), user


@dataclass(frozen=True)
class WebhookSettings:
    secret: str
    timeout: float = 10.0  # the whole request, connect to status line
    max_attempts: int = 8
    backoff_seconds: float = 10.0  # after attempt n: backoff * 2^(n-1), capped at 6 h by the database
    poll_seconds: float = 2.0
    batch: int = 10
    # Deliveries in flight to one receiver, fleet-wide (claim_webhook_deliveries' max_per_receiver).
    per_receiver: int = DEFAULT_WEBHOOK_PER_RECEIVER
    # An HTTP proxy every delivery goes through (an egress policy: README "Webhooks"); None:
    # direct. The environment's HTTP(S)_PROXY are never read (trust_env=False below).
    proxy: str | None = None
    # What signs a delivery (WEBHOOK_SIGNING_MODES): the fleet secret, the body's user's key
    # derived from it, or both.
    signing: str = DEFAULT_WEBHOOK_SIGNING
    # During a rotation, the secret before `secret`: each delivery also carries its v1 values,
    # so a receiver still on it verifies until it switches.
    previous_secret: str | None = None
    # Whether deliveries may reach loopback, private, link-local and other non-public addresses
    # (--allow-private-webhooks). Without it every address the sender connects to is checked at
    # delivery, so a name rebound to a private address after `serve` checked it is not reached.
    allow_private: bool = False
    # Networks deliveries may reach though they are not public (--webhook-allow-network): the
    # operator's own receivers, every other non-public address still refused.
    allow_networks: tuple[IPNetwork, ...] = ()

    def __post_init__(self) -> None:
        if not self.secret:
            raise ValueError("webhook secret must not be empty")
        if self.signing not in WEBHOOK_SIGNING_MODES:
            raise ValueError(
                f"webhook_signing must be one of {', '.join(WEBHOOK_SIGNING_MODES)}, got {self.signing!r}"
            )
        if self.previous_secret is not None and not self.previous_secret:
            raise ValueError("webhook previous secret must not be empty (None: no rotation under way)")
        if self.previous_secret == self.secret:
            raise ValueError(
                "the webhook previous secret is the current secret: in a rotation, the current "
                "secret is the new one"
            )
        if not isinstance(self.allow_networks, tuple) or not all(
            isinstance(n, ipaddress.IPv4Network | ipaddress.IPv6Network) for n in self.allow_networks
        ):
            raise ValueError(
                f"webhook allow_networks must be a tuple of ipaddress networks, got {self.allow_networks!r}"
            )
        for name, value in (
            ("webhook_timeout", self.timeout),
            ("webhook_attempts", self.max_attempts),
            ("webhook_backoff", self.backoff_seconds),
            ("webhook_poll", self.poll_seconds),
            ("webhook_per_receiver", self.per_receiver),
        ):
            check_setting(name, value)

    def describe_receivers(self) -> str:
        """Which receivers this worker's deliveries may reach, for its start line."""
        if self.allow_private:
            return "private receivers allowed"
        if self.proxy is not None:
            return "public receivers: the proxy's to check"
        if self.allow_networks:
            return "public receivers and " + ", ".join(str(n) for n in self.allow_networks)
        return "public receivers only"

    @property
    def lease_seconds(self) -> int:
        # Longer than any one request can take (the total timeout), so a live sender is never
        # overtaken; the margin (as long again, at least 5 s) covers recording the outcome on a
        # slow database. A worker killed mid-request costs its delivery this long.
        return min(3600, math.ceil(self.timeout) + max(5, math.ceil(self.timeout)))

    def keys_for(self, user: object) -> list[str]:
        """The keys that sign a delivery whose body's user_id is `user` (body_and_user's), one v1
        each: for the current secret then the previous one, the secret itself (fleet), the
        user's derived key (user), or both. Unsendable when the user's key is needed and `user`
        is no user id: every attempt would be the same."""
        if self.signing != "fleet" and not (user is None or (isinstance(user, str) and user)):
            why = user.why if isinstance(user, Unreadable) else f"{type(user).__name__} {str(user)[:100]!r}"
            raise Unsendable(f"no key can sign it: its payload's user_id is not a user id ({why})")
        user_id = user if isinstance(user, str) else None
        keys: list[str] = []
        for secret in (self.secret, self.previous_secret):
            if secret is None:
                continue
            if self.signing in ("fleet", "both"):
                keys.append(secret)
            if self.signing in ("user", "both"):
                keys.append(derive_user_secret(secret, user_id))
        return keys

    def describe_signing(self) -> str:
        """How deliveries are signed, for the log (never a secret)."""
        what = {
            "fleet": "the fleet secret",
            "user": "each user's key",
            "both": "the fleet secret and each user's key",
        }
        rotation = ", and the previous secret's (a rotation)" if self.previous_secret else ""
        return f"signed with {what[self.signing]}{rotation}"


def _host_of(url: str) -> str:
    """host:port of a proxy URL, for a log line (its user and password left out)."""
    parts = httpx.URL(url)
    return f"{parts.host}:{parts.port}" if parts.port else parts.host


# A permanent redirect (RFC 9110: 301 Moved Permanently, 308 Permanent Redirect) answers every
# attempt the same way: it ends the delivery at once, as 410 Gone does.
PERMANENT_REDIRECTS = frozenset({301, 308})


def redirect_error(status: int, location: str | None) -> str:
    """What a 3xx answer is recorded as. Redirects are never followed: the target is the
    receiver's to choose, and `serve`'s check of a user's webhook_url covers only the URL given
    (a redirect to a private address would pass it). The Location is quoted so a person sees
    where the receiver points, cut to 500 characters, anything unprintable shown as '?'."""
    where = "no Location" if not location else "".join(c if c.isprintable() else "?" for c in location[:500])
    if status in PERMANENT_REDIRECTS:
        return (
            f"HTTP {status}: the receiver says this URL moved for good (Location: {where}); "
            "redirects are not followed: fix the run's webhook_url"
        )
    return f"HTTP {status}: redirects are not followed (Location: {where})"


class Unsendable(Exception):
    """The delivery's URL is one no request can be sent to (httpx refuses it): every attempt would
    fail the same way, so it is dead-lettered on this one."""


async def deliver(
    client: httpx.AsyncClient, d: Delivery, settings: WebhookSettings
) -> tuple[int | None, str | None]:
    """POST one delivery. (status, None) when the receiver answered 2xx, else (status or None, error).
    Unsendable: the URL cannot be requested at all."""
    body, user = body_and_user(d.payload_json)
    timestamp = int(d.claimed_at.timestamp())
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: signature_header(settings.keys_for(user), timestamp, body),
        DELIVERY_HEADER: str(d.delivery_id),
        ATTEMPT_HEADER: str(d.attempt),
    }
    try:
        request = client.build_request("POST", d.url, content=body, headers=headers)
    except Exception as exc:
        # A URL httpx cannot parse (InvalidURL, or idna's own errors for a host like xn--a) is
        # not an HTTPError: it escaped, no outcome was recorded, and each attempt waited out its
        # lease before it was dead-lettered as "recorded no outcome" (http://e.com:abc/).
        raise Unsendable(f"webhook_url cannot be requested ({type(exc).__name__}: {exc})"[:2000]) from None
    try:
        # httpx's timeout is per phase; a receiver trickling bytes would never trip it.
        async with asyncio.timeout(settings.timeout):
            # The response body is never read: a receiver cannot make us buffer anything.
            response = await client.send(request, stream=True)
            try:
                status = response.status_code
                location = response.headers.get("location")
            finally:
                await response.aclose()
    except (TimeoutError, httpx.TimeoutException):
        return None, f"timed out after {settings.timeout:g} s"
    except httpx.UnsupportedProtocol as exc:
        raise Unsendable(f"webhook_url cannot be requested ({exc})"[:2000]) from None
    except NotPublic as exc:
        # Not connected to. An address as the host is refused the same way at every attempt (a
        # person allows it, then re-arms the delivery), so it ends on this one; a name's answer
        # may change (split horizon, a sinkhole lifted), so it is retried as one that does not
        # resolve is.
        if exc.literal:
            raise Unsendable(str(exc)[:2000]) from None
        return None, str(exc)[:2000]
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:2000]
    if not 100 <= status <= 599:
        # httpx takes any three digits; fail_webhook_delivery records 100..599, and refused a 999,
        # so every attempt waited out its lease and the cause was lost ("recorded no outcome").
        return None, f"HTTP {status}: not an HTTP status code"
    if 200 <= status < 300:
        return status, None
    if 300 <= status < 400:
        return status, redirect_error(status, location)
    return status, f"HTTP {status}"


async def _deliver_and_record(
    pool: AsyncConnectionPool, client: httpx.AsyncClient, d: Delivery, settings: WebhookSettings
) -> None:
    extra = {"run_id": str(d.run_id)}
    permanent = False
    started = time.monotonic()
    try:
        status, error = await deliver(client, d, settings)
    except Unsendable as exc:
        status, error = None, str(exc)
        permanent = True  # a deterministic failure ends once
    seconds = time.monotonic() - started
    if status == 410:
        # Gone: "likely to be permanent" (RFC 9110), the REST Hooks way for a receiver to say
        # "stop sending". Every retry would be refused the same way, so this one is the last.
        error, permanent = "HTTP 410: the receiver says this URL is gone for good", True
    elif status in PERMANENT_REDIRECTS:
        # Retried until the attempts ran out, each answered the same; the delivery keeps its URL,
        # so only a new run with a fixed webhook_url reaches the receiver.
        permanent = True
    async with pool.connection() as conn:
        if error is None:
            assert status is not None
            # The receiver has it, whether or not the lease was still ours to record it.
            metrics.webhook_delivery("delivered", seconds)
            if await complete_webhook_delivery(conn, d.delivery_id, d.claim_token, status):
                log.info(
                    "webhook %s delivered (HTTP %d, attempt %d)",
                    d.delivery_id,
                    status,
                    d.attempt,
                    extra=extra,
                )
            else:
                log.info("webhook %s delivered but the lease was taken over", d.delivery_id, extra=extra)
            return
        outcome = await fail_webhook_delivery(
            conn,
            d.delivery_id,
            d.claim_token,
            error,
            status,
            settings.max_attempts,
            settings.backoff_seconds,
            permanent,
        )
    # Counted once recorded: a failure the database refused (the lease was taken over) counts as
    # failed; one whose recording raised is not counted (its lease lapses, it is tried again).
    metrics.webhook_delivery("dead_lettered" if outcome == "dead" else "failed", seconds)
    if outcome == "dead":
        log.warning(
            "webhook %s dead-lettered after %d attempts: %s", d.delivery_id, d.attempt, error, extra=extra
        )
    else:
        log.info(
            "webhook %s attempt %d failed (%s): %s", d.delivery_id, d.attempt, outcome, error, extra=extra
        )


async def _deliver_logged(
    pool: AsyncConnectionPool, client: httpx.AsyncClient, d: Delivery, settings: WebhookSettings
) -> None:
    try:
        await _deliver_and_record(pool, client, d, settings)
    except Exception as exc:
        # The outcome was not recorded: the lease lapses and the delivery is tried again.
        log.warning("webhook %s: could not record the outcome: %s", d.delivery_id, exc)


async def webhook_loop(
    pool: AsyncConnectionPool,
    settings: WebhookSettings,
    *,
    worker_id: str | None,
    hub: Hub | None = None,
    stopping: asyncio.Event | None = None,
) -> None:
    """Deliver until cancelled, or until `stopping` is set: then claim nothing more, let the
    deliveries in flight end (each within the timeout, their outcomes recorded) and return. A
    drain used to cancel them mid-POST: each lost an attempt and waited out its lease, was likely
    sent twice, and one on its last attempt was dead-lettered unsent by the next claim though its
    receiver answered 200 (the webhooks audit).

    Up to settings.batch at once. Woken by runrow_webhooks (the outbox's
    trigger sends it with each new delivery, retry_webhook_delivery with a re-armed one, so it
    goes out at once; migration 0082), by the poll tick (retries
    whose backoff passed, lapsed leases, and everything when NOTIFY is lost), and by a delivery
    ending: its slot is free, and its receiver may have a delivery the claim held back at the
    receiver's cap (settings.per_receiver, fleet-wide), which would otherwise wait for the tick.

    Each delivery runs on its own, and a slot it frees is claimed again at once: a batch used to
    be claimed and waited for whole (gather), so one receiver that hung to the timeout held up
    every other delivery of this worker for that long."""
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(
            sender_client(
                settings.timeout,
                USER_AGENT,
                settings.proxy,
                allow_private=settings.allow_private,
                allowed_networks=settings.allow_networks,
            )
        )
        wakes = await stack.enter_async_context(hub.subscribe(channels.WEBHOOKS)) if hub else None
        # Entered last, so left first: a cancelled loop cancels its deliveries (their leases
        # lapse and another worker sends them) before the client closes under them.
        sending = await stack.enter_async_context(asyncio.TaskGroup())
        in_flight: set[asyncio.Task[None]] = set()
        log.info(
            "webhook delivery on: timeout %gs, lease %ds, %d attempts, backoff %gs doubling, %d at once, "
            "%d per receiver%s, %s; %s",
            settings.timeout,
            settings.lease_seconds,
            settings.max_attempts,
            settings.backoff_seconds,
            settings.batch,
            settings.per_receiver,
            "" if settings.proxy is None else f", through the proxy at {_host_of(settings.proxy)}",
            settings.describe_receivers(),
            settings.describe_signing(),
        )
        if settings.signing != "fleet" and len(settings.secret) < MIN_SECRET_FOR_USER_KEYS:
            # A user's key is an HMAC of a known message under the fleet secret: a user can try
            # guesses of the secret against it offline, and the one that matches signs for all.
            log.warning(
                "the webhook secret is %d characters: with users' keys it must be a random key "
                "no one can guess (openssl rand -hex 32)",
                len(settings.secret),
            )
        while stopping is None or not stopping.is_set():
            free = settings.batch - len(in_flight)
            more = False
            if free > 0:
                try:
                    async with pool.connection() as conn:
                        claimed = await claim_webhook_deliveries(
                            conn,
                            worker_id,
                            free,
                            settings.lease_seconds,
                            settings.max_attempts,
                            settings.per_receiver,
                        )
                except Exception as exc:
                    log.warning("webhook claim failed, retrying after the poll tick: %s", exc)
                    claimed = []
                for d in claimed:
                    task = sending.create_task(_deliver_logged(pool, client, d, settings))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
                more = len(claimed) == free  # more may be due than the free slots took
            if len(in_flight) >= settings.batch:
                await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            elif not more:
                await _idle(wakes, settings.poll_seconds * random.uniform(0.8, 1.2), stopping, in_flight)
        if in_flight:
            log.info("webhook delivery stopping: %d in flight end first", len(in_flight))
            await asyncio.wait(in_flight)


async def _idle(
    wakes: asyncio.Queue[str] | None,
    timeout: float,  # noqa: ASYNC109
    stopping: asyncio.Event | None = None,
    sending: set[asyncio.Task[None]] | None = None,
) -> None:
    """Wait for a wake, the poll tick, the loop's stop or the end of one of the deliveries
    `sending`, whichever comes first."""
    waiting = asyncio.ensure_future(
        within(wakes.get(), timeout) if wakes is not None else asyncio.sleep(timeout)
    )
    stopped = asyncio.ensure_future(stopping.wait()) if stopping is not None else None
    ends = list(sending or ())  # waited for, never cancelled here
    try:
        done, _ = await asyncio.wait(
            [w for w in (waiting, stopped) if w is not None] + ends, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for w in (waiting, stopped):
            if w is not None:
                w.cancel()
    if wakes is None or (stopped is not None and stopped.done()) or not done.isdisjoint(ends):
        return
    # Enqueues wake us too: one claim per burst of signals, not one per signal.
    await asyncio.sleep(0.05)
    while not wakes.empty():
        wakes.get_nowait()
