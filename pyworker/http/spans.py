"""A SERVER span per request of `runrow serve` (OpenTelemetry's stable HTTP conventions), so the
operator's trace runs caller → request → the run's attempts: a run enqueued inside the span
stores the span's traceparent (routes_runs._with_traceparent) and every attempt is its child.

The span's parent is the request's W3C `traceparent` / `tracestate` (as the worker reads a run's
metadata.traceparent). Its name is the method and the route's template (`POST
/conversations/{conversation_id}/runs`), never the path: a name per run id would be a span name
per request in every backend's index; a path no route matches is named by its method alone.
Status ERROR for a 5xx, or an exception that escaped (the client got a 500 or a cut response); a
4xx is the caller's mistake, not the service failing, and stays UNSET.

Attributes: http.request.method, http.route, http.response.status_code, url.scheme, url.path,
server.address / server.port (the Host header, as sent: serve reads no proxy headers),
client.address, network.protocol.version, user_agent.original, error.type. Not the query string
(a custom authenticator may take a secret there, as the access log says) nor the user id: a trace
backend is read more widely than the database, with no per-user rule, and a user id is often an
email address; url.path holds the run or conversation id, which leads to the user for whoever
may read the database.

An event stream's span ends when its head (200, text/event-stream) is sent, not when the stream
does: a stream is open for minutes to hours, and a span is exported only once ended, so a span
for the stream's life was invisible until then and lost with the process (a deploy, SIGKILL),
and its duration said nothing about the service. The span times what the client waits for
(authentication, the ownership check, opening the tail); each reconnect is a request, so a span,
of its own, with the cursor it resumed from (runrow.stream.from_seq). How long a stream stayed
open is the access log's (--access-log) line.

Without the `otel` extra the app has no such middleware; with it but no tracer provider (the
tracing off) a request costs one provider check and no span.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pyworker.http.access_log import request_path
from pyworker.worker import tracing

if tracing.ENABLED:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

SCOPE = "runrow.http"
# The methods http.request.method names as they are (RFC 9110, PATCH, QUERY); any other is _OTHER.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "QUERY"})
EVENT_STREAM = b"text/event-stream"
_PROPAGATED = {b"traceparent": "traceparent", b"tracestate": "tracestate"}
MAX_HOST = 255  # a Host header is the client's text: no longer than a DNS name


class ServerSpans:
    """ASGI middleware: outermost, so the span holds every other layer and sees the status the
    client got (a 500 included)."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Asked per request: the embedding application may install a provider after startup.
        spans = tracing.tracer(SCOPE) if scope["type"] == "http" else None
        if spans is None:
            await self.app(scope, receive, send)
            return
        method = scope["method"] if scope["method"] in METHODS else None
        route = route_template(self.routes, scope)
        span = spans.start_span(
            " ".join(part for part in (method or "HTTP", route) if part),
            context=_parent(scope),
            kind=SpanKind.SERVER,
            attributes=request_attributes(scope, method, route),
        )
        ended = False

        def end() -> None:
            nonlocal ended
            if not ended:
                ended = True
                span.end()

        async def send_noting_status(message: Message) -> None:
            head = message["type"] == "http.response.start"
            if head:
                _response_started(span, message["status"])
            await send(message)
            if head and _content_type(message).startswith(EVENT_STREAM):
                end()

        with trace.use_span(span, record_exception=False, set_status_on_exception=False):
            try:
                await self.app(scope, receive, send_noting_status)
            except Exception as exc:
                if not ended:
                    span.record_exception(exc)
                    span.set_attribute("error.type", type(exc).__qualname__)
                    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__qualname__}: {exc}"[:200]))
                raise
            finally:
                end()


def annotate(key: str, value: Any) -> None:
    """An attribute on the request's span, if one is recording (a route's own detail)."""
    if not tracing.ENABLED:
        return
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute(key, value)


def route_template(routes: Sequence[BaseRoute], scope: Scope) -> str | None:
    """The template of the route that serves the request (as Starlette's router picks it: the
    first full match, else the first that matched all but the method, a 405), or None."""
    partial: BaseRoute | None = None
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return _template(route)
        if match is Match.PARTIAL and partial is None:
            partial = route
    return None if partial is None else _template(partial)


def _template(route: BaseRoute) -> str | None:
    # Route and Mount (`/static/{path}`) keep the path without its parameters' converters.
    template = getattr(route, "path_format", None)
    return template if isinstance(template, str) else None


def _parent(scope: Scope) -> Any:
    carrier: dict[str, list[str]] = {}
    for name, value in scope.get("headers", ()):
        key = _PROPAGATED.get(name.lower())
        if key is not None:
            carrier.setdefault(key, []).append(value.decode("latin-1"))
    return TraceContextTextMapPropagator().extract(carrier)


def request_attributes(scope: Scope, method: str | None, route: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "http.request.method": method or "_OTHER",
        "url.scheme": scope.get("scheme", "http"),
        "url.path": request_path(scope),
    }
    if method is None:
        attributes["http.request.method_original"] = scope["method"][:40]
    if route is not None:
        attributes["http.route"] = route
    if scope.get("http_version"):
        attributes["network.protocol.version"] = scope["http_version"]
    host, port = _server(scope)
    if host:
        attributes["server.address"] = host
    if port is not None:
        attributes["server.port"] = port
    client = scope.get("client")
    if client:
        attributes["client.address"] = client[0]
    agent = _header(scope, b"user-agent")
    if agent:
        attributes["user_agent.original"] = agent[:512]
    return attributes


def _server(scope: Scope) -> tuple[str | None, int | None]:
    """Host and port from the Host header (the name the client asked for), else the socket's."""
    value = _header(scope, b"host")
    if value is None:
        server = scope.get("server")
        return (server[0], server[1]) if server else (None, None)
    value = value.strip()[:MAX_HOST]
    host, colon, port = value.rpartition(":")
    if not colon or not (port.isascii() and port.isdigit() and len(port) <= 5) or not host:
        host, port = value, ""  # no port, or `[::1]`'s colons
    return host.removeprefix("[").removesuffix("]") or None, int(port) if port else None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")  # type: ignore[no-any-return]
    return None


def _content_type(message: Message) -> bytes:
    for key, value in message.get("headers", ()):
        if key.lower() == b"content-type":
            return value.lower()  # type: ignore[no-any-return]
    return b""


def _response_started(span: Any, status: int) -> None:
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_attribute("error.type", str(status))
        span.set_status(Status(StatusCode.ERROR))
