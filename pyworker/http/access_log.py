"""One access line per request, when the operator asks for it (`runrow serve --access-log`).

uvicorn's own access log is never used: it printed the path with its query string (`?token=…`
would be in the logs), in its own format beside runrow's, at INFO for every Prometheus scrape.
This one prints the path alone, percent-encoded as it came, through runrow's handler (text or
json; in json the fields are also an `http` object), and is off unless asked for.

A line is written when the response is over, with how long it took: for an event stream, how
long the stream was open. Example (text):

    2026-01-05 10:00:00,123 INFO runrow.http.access 10.0.0.7:50412 "GET /runs/0190…/events" 200 8210.4 ms
"""

from __future__ import annotations

import logging
import time
from urllib.parse import quote_from_bytes

from starlette.types import ASGIApp, Receive, Scope, Send

from pyworker.http.observed import call_noting_status
from pyworker.worker.logs import HTTP_FIELD

log = logging.getLogger("runrow.http.access")

# What a path may show as is: RFC 3986's pchar and "/"; "%" so an encoded byte stays as sent.
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"


class AccessLog:
    """ASGI middleware: outermost, so the status is the one the client got (a 500 included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        await call_noting_status(
            self.app,
            scope,
            receive,
            send,
            lambda status: _log(scope, status, (time.perf_counter() - started) * 1000),
        )


def _log(scope: Scope, status: int, ms: float) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    client = scope.get("client")
    peer = f"{client[0]}:{client[1]}" if client else "-"
    method, path = scope["method"], request_path(scope)
    fields = {
        "method": method,
        "path": path,
        "status": status or None,  # None: the client left before any response
        "duration_ms": round(ms, 1),
        "client": peer,
    }
    log.info('%s "%s %s" %s %.1f ms', peer, method, path, status or "-", ms, extra={HTTP_FIELD: fields})


def request_path(scope: Scope) -> str:
    """The request's path without its query string, which can carry tokens and secrets: the
    bytes as sent (raw_path) where the server gives them, with anything outside a URL path's
    characters (a control character would forge a text line) percent-encoded."""
    raw = scope.get("raw_path")
    if raw is None:
        raw = (scope.get("root_path", "") + scope["path"]).encode("utf-8", "surrogateescape")
    # Some servers put the query string into raw_path too: never past the "?".
    return quote_from_bytes(raw.partition(b"?")[0], safe=_PATH_SAFE)
