"""Security headers on every response the service sends: the page, its files, JSON, event
streams and errors, 500s included.

The audit found none: a page framing the service at opacity 0.3 had a user's click approve a
pending tool call (clickjacking), and JSON answers carried no Cache-Control, so a shared or
disk cache could keep a user's conversation. A pure ASGI middleware, not BaseHTTPMiddleware:
that one runs the endpoint in a task of its own and buffers through a memory stream, which
breaks an event stream's disconnect handling (sse.EventStreamResponse watches `receive`).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The page loads only its own script, stylesheet and API (no inline script or style, no data:
# images), and may not be framed, post forms or change its base URL.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

# Set on every response, replacing any a route set: no route may weaken them.
ALWAYS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),  # frame-ancestors for browsers that predate CSP 2
    (b"x-content-type-options", b"nosniff"),  # a JSON body is never run as a script
    (b"referrer-policy", b"no-referrer"),  # no URL of the service is told to another site
)
_REPLACED = {name for name, _ in ALWAYS}

# What a response that says nothing about caching gets: API answers hold one user's data. The
# page and its files say `no-cache` themselves (revalidate: they hold no data).
DEFAULT_CACHE_CONTROL = b"no-store"


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": with_security_headers(message.get("headers", []))}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def with_security_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    kept = [(name, value) for name, value in headers if name.lower() not in _REPLACED]
    if not any(name.lower() == b"cache-control" for name, _ in kept):
        kept.append((b"cache-control", DEFAULT_CACHE_CONTROL))
    return [*kept, *ALWAYS]
