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
from pyworker.http.auth import authenticated_user
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
        user = await authenticated_user(request, svc.authenticate)
        reject_unknown_query(request, query)
        return await endpoint(request, svc, user)

    return route
