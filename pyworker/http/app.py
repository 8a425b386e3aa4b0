"""The app factory: `create_app(config) -> Starlette`.

One connection pool and one Hub (a single LISTEN connection) per process, opened by the
lifespan. Nothing else is kept in memory: any instance can serve any run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.types import ASGIApp

from pyworker.db import finite_json
from pyworker.db.cancel_safe_pool import CancelSafePool
from pyworker.db.hub import Hub
from pyworker.db.pooling import POOLER_SAFE, accepted_kwargs_within
from pyworker.db.session_limits import serve_connection_kwargs
from pyworker.http import metrics as http_metrics
from pyworker.http import routes_approvals, routes_metrics, routes_page, routes_runs
from pyworker.http.access_log import AccessLog
from pyworker.http.auth import authenticator_for
from pyworker.http.auth_throttle import AuthFailureLimiter
from pyworker.http.config import ServeConfig
from pyworker.http.context import Services
from pyworker.http.errors import EXCEPTION_HANDLERS
from pyworker.http.headers import SecurityHeaders
from pyworker.http.metrics import RequestMetrics
from pyworker.http.replica import open_replica
from pyworker.http.request_guard import RequestGuard
from pyworker.http.spans import ServerSpans
from pyworker.http.sse import StreamStats
from pyworker.worker import metrics, tracing

log = logging.getLogger("runrow.http")

# Seconds a request waits for a database connection before it answers 503 (with Retry-After).
# psycopg_pool's default, 30 s, held every request that long while the database was down (the
# HTTP audit); a client or a load balancer had given up long before. Under load the pool's
# connections are busy for milliseconds at a time, so a wait this long means the database is
# away or overloaded, and a 503 is the answer either way.
REQUEST_POOL_TIMEOUT = 5.0
# Seconds the service waits at its start for the database (it waited 30 s for its pool alone).
START_TIMEOUT = 30.0
# /healthz's and the scrapes' own connections, beside the request pool (README, For DBAs). Two:
# a scrape may hold one for seconds (queue_metrics on a loaded database; concurrent scrapes share
# one query), and with one /healthz waited behind it and answered 503, the database fine.
PROBE_CONNECTIONS = 2


def create_app(config: ServeConfig) -> Starlette:
    authenticate = authenticator_for(config)  # fails now, not on the first request, when misconfigured
    per_minute = config.auth_failures_per_minute
    auth_failures = AuthFailureLimiter(per_minute) if per_minute > 0 else None

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        listen_url = config.listen_url or config.database_url
        # Without them a network black hole held every request on a pooled connection until the
        # kernel's TCP timeout (minutes). Through a pooler that refuses `options`, the libpq
        # keepalives stay and the server-side settings are the deployment's (README).
        limits: dict[str, Any] = {}
        hub_limits: dict[str, Any] = {}
        replica_limits: dict[str, Any] = {}
        # One wait for a database that is not up yet, whoever waits: the probes, then the pool.
        deadline = time.monotonic() + START_TIMEOUT
        if config.session_limits:
            targets = [(config.database_url, "serve pool"), (listen_url, "serve hub (LISTEN)")]
            if config.replica_url is not None:
                targets.append((config.replica_url, "serve replica pool"))
            limits, hub_limits, *rest = await accepted_kwargs_within(
                [(url, serve_connection_kwargs(url), what) for url, what in targets], deadline=deadline
            )
            replica_limits = rest[0] if rest else {}
        pool = CancelSafePool(
            config.database_url,
            min_size=config.pool_min_size,
            max_size=config.pool_max_size,
            kwargs={"autocommit": True, "application_name": "runrow-serve", **POOLER_SAFE, **limits},
            configure=finite_json.configure,  # a number past the float range must not break JSON out
            timeout=config.pool_timeout or REQUEST_POOL_TIMEOUT,
            open=False,
        )
        await pool.open(wait=True, timeout=max(1.0, deadline - time.monotonic()))
        # The worker's metrics have one too (pyworker/worker/process.py): a probe says whether
        # the database answers, not whether a request pool has a connection free.
        probe = CancelSafePool(
            config.database_url,
            min_size=1,
            max_size=PROBE_CONNECTIONS,
            kwargs={"autocommit": True, "application_name": "runrow-serve-probe", **POOLER_SAFE, **limits},
            configure=finite_json.configure,
            timeout=REQUEST_POOL_TIMEOUT,
            open=False,
        )
        await probe.open(wait=True, timeout=max(1.0, deadline - time.monotonic()))
        replica = await open_replica(config, replica_limits) if config.replica_url is not None else None
        # LISTEN on the primary (directly, not through a pooler): a standby in recovery refuses
        # LISTEN, and a transaction pooler drops notifications.
        hub = Hub(listen_url, application_name="runrow-serve-hub", connect_kwargs=hub_limits)
        await hub.start()
        await hub.wait_connected(5)  # not required: tails poll while the hub is down
        metrics.watch_hub(lambda: hub.connected)
        streams = StreamStats()
        http_metrics.register(lambda: streams.open)
        # Warns when the LISTEN URL goes through a pooler that drops notifications.
        self_test = asyncio.create_task(hub.self_test(pool), name="runrow-serve-hub-self-test")
        metrics_server = None
        if config.metrics_port is not None:
            # The worker's listener (GET /metrics, 404 otherwise), scraping over the probe's
            # connection; the API's port then has no /metrics route.
            metrics_server = await metrics.serve(probe, config.metrics_host, config.metrics_port)
            app.state.metrics_address = metrics_server.sockets[0].getsockname()[:2]
            log.info("metrics on http://%s:%d/metrics", *app.state.metrics_address)
        app.state.services = Services(
            config, authenticate, pool, hub, streams, replica, probe=probe, auth_failures=auth_failures
        )
        log.info("runrow serve ready (model %s, auth %s)", config.model, _auth_name(config))
        try:
            yield
        finally:
            if metrics_server is not None:
                metrics_server.close()
            self_test.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self_test
            await hub.stop()
            if replica is not None:
                await replica.pool.close()
            await pool.close()
            await probe.close()

    return _Service(
        access_log=config.access_log,
        routes=[
            *routes_runs.routes,
            *routes_approvals.routes,
            *(routes_metrics.routes if config.metrics_port is None else []),
            *routes_page.routes,
        ],
        exception_handlers=EXCEPTION_HANDLERS,
        # Before routing, so no route reads a forged request; inside the security headers.
        middleware=[Middleware(RequestGuard, loopback_only=config.insecure_dev)],
        lifespan=lifespan,
    )


class _Service(Starlette):
    def __init__(self, *, access_log: bool, **kwargs: Any) -> None:
        self._access_log = access_log
        super().__init__(**kwargs)

    def begin_shutdown(self) -> None:
        """The server stops taking requests (uvicorn's shutdown, pyworker/http/server.py): end
        every event stream now, each with a clean last chunk for its client to resume elsewhere
        with Last-Event-ID. Held instead, they used up the whole --shutdown-grace and were then
        cancelled mid-response (a cut transfer, and one ERROR traceback per stream). On the
        service's event loop."""
        svc: Services | None = getattr(self.state, "services", None)
        if svc is None or svc.stopping.is_set():
            return
        if svc.streams.open:
            log.info("shutting down: ending %d event stream(s)", svc.streams.open)
        svc.stopping.set()

    def build_middleware_stack(self) -> ASGIApp:
        # Outside Starlette's ServerErrorMiddleware, which sends a 500 itself, past any
        # middleware given to Starlette(middleware=...): a 500 carries the headers too.
        # Metrics outside the error middleware too, so a 500 is counted as the 500 the client got.
        app: ASGIApp = SecurityHeaders(RequestMetrics(super().build_middleware_stack(), self.routes))
        # So a line has the status the client got; absent when off, not a no-op per request.
        if self._access_log:
            app = AccessLog(app)
        # Outermost: the request's span holds every layer (the access line included). Absent
        # without the otel extra; without a tracer provider it only asks for one per request.
        return ServerSpans(app, self.routes) if tracing.ENABLED else app


def _auth_name(config: ServeConfig) -> str:
    if config.authenticate is not None:
        return "custom"
    return "insecure-dev" if config.insecure_dev else f"bearer ({len(config.tokens)} tokens)"
