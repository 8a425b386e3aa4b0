"""The HTTP service's own Prometheus series, registered by the app (create_app): requests by
route template and status, their durations, and the event streams open and refused.

`route` is the matched route's template (`/runs/{run_id}`), never the request's path, which
would be a series per run id; a path no route matches counts as `unmatched`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from prometheus_client import Counter, Gauge, Histogram
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from pyworker.http.observed import call_noting_status
from pyworker.http.spans import route_template
from pyworker.worker import metrics

UNMATCHED = "unmatched"
NO_RESPONSE = "none"  # the client left before any response began
# Seconds: most requests take milliseconds; an event stream lasts as long as its client stays.
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600)

REQUESTS = Counter(
    "runrow_http_requests",
    "HTTP requests this service answered, by route template and status code.",
    ["route", "status"],
    registry=None,
)
DURATION = Histogram(
    "runrow_http_request_duration_seconds",
    "Request start to response end, by route template (an event stream: how long it was open).",
    ["route"],
    buckets=_BUCKETS,
    registry=None,
)
STREAMS_OPEN = Gauge("runrow_http_streams_open", "Event streams open on this service now.", registry=None)
STREAMS_REFUSED = Counter(
    "runrow_http_streams_refused",
    "Event streams refused with a 429: the user held --max-streams-per-user open on this service.",
    registry=None,
)
AUTH_FAILURES = Counter(
    "runrow_http_auth_failures",
    "Requests that did not authenticate, by the status they got: 401 (no token, or a wrong "
    "one) or 429 (their address failed --auth-failures-per-minute times; not checked further).",
    ["status"],
    registry=None,
)


def register(streams_open: Callable[[], int]) -> None:
    """Export the HTTP series from this process; streams_open is read at every scrape."""
    metrics.register((REQUESTS, DURATION, STREAMS_OPEN, STREAMS_REFUSED, AUTH_FAILURES))
    STREAMS_OPEN.set_function(lambda: float(streams_open()))


def stream_refused() -> None:
    STREAMS_REFUSED.inc()


def auth_failed(status: int) -> None:
    AUTH_FAILURES.labels(str(status)).inc()


class RequestMetrics:
    """ASGI middleware counting and timing every HTTP request by its route's template."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        await call_noting_status(
            self.app, scope, receive, send, lambda status: self._count(scope, status, started)
        )

    def _count(self, scope: Scope, status: int, started: float) -> None:
        route = route_template(self.routes, scope) or UNMATCHED
        REQUESTS.labels(route, str(status) if status else NO_RESPONSE).inc()
        DURATION.labels(route).observe(time.perf_counter() - started)
