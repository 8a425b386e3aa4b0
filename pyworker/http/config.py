"""What one `runrow serve` process is configured with."""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from pyworker.worker.public_addresses import IPNetwork

# Returns the authenticated user id, or None for "not authenticated" (401).
Authenticate = Callable[[Request], "Awaitable[str | None] | str | None"]

MAX_BODY_BYTES = 256 * 1024


# The enqueue fields a user may always set, and those the operator opts into (`runrow serve
# --user-may-set`): each of the latter overrides the operator's agent or spends the operator's
# money or network (the security audit: any user could pin another model, a system prompt of
# their own, any registered tool, max_tokens and thinking budgets in metadata, and a webhook to
# an internal address).
USER_FIELDS = frozenset({"content", "if_active", "start_in", "token_budget", "cost_budget"})
OPT_IN_FIELDS = ("model", "system", "tools", "max_attempts", "metadata", "webhook_url")


@dataclass(frozen=True)
class ServeConfig:
    database_url: str
    # Pinned on every run enqueued without its own model / system / tools.
    model: str
    system_prompt: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    # Bearer token -> user id. Used unless `authenticate` is given.
    tokens: Mapping[str, str] = field(default_factory=dict)
    # Any request is user `dev` (or its X-Runrow-User header). Loopback only (the CLI checks the host).
    insecure_dev: bool = False
    authenticate: Authenticate | None = None
    keepalive_seconds: float = 15.0
    poll_seconds: float = 1.0
    max_body_bytes: int = MAX_BODY_BYTES
    pool_min_size: int = 1
    pool_max_size: int = 10
    # Seconds a request waits for a pooled connection before its 503 (None: the app's 5 s).
    pool_timeout: float | None = None
    # A hot standby that event streams read journals from (the primary still serves everything
    # else and the LISTEN); None reads them from the primary.
    replica_url: str | None = None
    # A direct URL for the hub's LISTEN when database_url goes through a transaction pooler.
    listen_url: str | None = None
    # Keepalives, tcp_user_timeout and a statement_timeout on every connection
    # (session_limits.serve_connection_kwargs); off: the deployment sets them server-side.
    session_limits: bool = True
    # The OPT_IN_FIELDS users may set on their runs (the rest are the operator's: 403).
    user_may_set: frozenset[str] = frozenset()
    # A user's webhook_url may point at loopback, private, link-local and other non-public
    # addresses (local development; receivers on the operator's own network). Off, it is a 422.
    allow_private_webhooks: bool = False
    # Networks a user's webhook_url may point into though they are not public (the workers'
    # --webhook-allow-network, which serve takes too): every other non-public address stays a 422.
    webhook_allow_networks: tuple[IPNetwork, ...] = ()
    # Attempts of a run enqueued without its own max_attempts (`runrow serve --max-attempts`):
    # 1, enqueue_run's default, is at-most-once; more requeues a run whose worker died.
    max_attempts: int = 1
    # Event streams one user may hold open on this process; more is a 429 (0: no limit).
    max_streams_per_user: int = 100
    # Failed authentications a client address may make a minute (a token bucket of that many);
    # past it, a 429 (pyworker/http/auth_throttle.py). 0: no limit.
    auth_failures_per_minute: int = 10
    # One line per request on the logger runrow.http.access (path only, never the query
    # string); off, a service scraped every few seconds does not log each scrape.
    access_log: bool = False
    # GET /metrics on a listener of its own (0: any free port), and not on the API's port;
    # None: on the API's port.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        # Checked here, not at the first webhook_url: a list of strings given in code would make
        # every such enqueue a 500 rather than refuse to start.
        if not isinstance(self.webhook_allow_networks, tuple) or not all(
            isinstance(n, ipaddress.IPv4Network | ipaddress.IPv6Network) for n in self.webhook_allow_networks
        ):
            raise ValueError(
                "webhook_allow_networks must be a tuple of ipaddress networks, "
                f"got {self.webhook_allow_networks!r}"
            )
