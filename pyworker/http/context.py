"""What every route needs: the pool, the hub, the configuration and the caller's user id."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import wraps

from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request
from starlette.responses import Response

from pyworker.db.hub import Hub
from pyworker.http import metrics as http_metrics
from pyworker.http.auth import too_many_auth_failures, unauthorized, user_of
from pyworker.http.auth_throttle import AuthFailureLimiter, address_key
from pyworker.http.bodies import reject_unknown_query
from pyworker.http.config import Authenticate, ServeConfig
from pyworker.http.replica import Replica
from pyworker.http.sse import StreamStats


@dataclass
class Services:
    config: ServeConfig
    authenticate: Authenticate
    pool: AsyncConnectionPool
    hub: Hub
    streams: StreamStats
    # The hot standby event streams read journals from (--replica-url), if any.
    replica: Replica | None = None
    # Set when the server begins to shut down: every event stream ends at once (it never ends
    # on its own), so the graceful-shutdown window is left to the requests that do.
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # /healthz's and /metrics' own connection (None: they use `pool`). On the request pool, a
    # pool busy with requests (every connection waiting on a lock) made /healthz answer 503
    # "database unavailable" and a scrape wait its 5 s out, with the database itself fine.
    probe: AsyncConnectionPool | None = None
    # Failed authentications by client address (--auth-failures-per-minute; None: off).
    auth_failures: AuthFailureLimiter | None = None

    @property
    def probe_pool(self) -> AsyncConnectionPool:
        return self.probe or self.pool


def services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


Endpoint = Callable[[Request, Services, str], Awaitable[Response]]


def authenticated(
    endpoint: Endpoint, query: frozenset[str] = frozenset()
) -> Callable[[Request], Awaitable[Response]]:
    """Run `endpoint(request, services, user_id)` for an authenticated caller; 401 otherwise,
    and 400 naming a query parameter that is not in `query`."""

    @wraps(endpoint)
    async def route(request: Request) -> Response:
        svc = services(request)
        user = await authenticated_caller(request, svc)
        reject_unknown_query(request, query)
        return await endpoint(request, svc, user)

    return route


async def authenticated_caller(request: Request, svc: Services) -> str:
    """The caller's user id; a 401 when it has none, a 429 when its address failed too often
    (pyworker/http/auth_throttle.py says who still passes and why)."""
    user = await user_of(request, svc.authenticate)
    limiter = svc.auth_failures
    address = address_key(request.client.host if request.client else None)
    # Looked at after the authenticator's await, and charged with no await between: a burst of
    # concurrent guesses cannot all pass one look at a bucket with one failure left.
    if limiter is not None:
        wait = limiter.retry_after(address)
        if wait is not None and (user is None or not limiter.may_pass(address, user)):
            http_metrics.auth_failed(429)
            raise too_many_auth_failures(svc.config.auth_failures_per_minute, wait)
    if user is None:
        if limiter is not None:
            limiter.failed(address)
        http_metrics.auth_failed(401)
        raise unauthorized()
    if limiter is not None:
        limiter.succeeded(address, user)
    return user
