"""Refuses requests a browser sends on another site's behalf, before any route reads them.

The web audit (--insecure-dev, where no token is needed): a page on another origin POSTed a
prompt with fetch(..., {mode: "no-cors"}) and a run was enqueued as user `dev` (cross-site
request forgery), and a request with `Host: attacker.example:PORT` read the approvals (DNS
rebinding: a name the attacker controls, pointed at 127.0.0.1, makes their page same-origin
with the service). With bearer tokens neither works (a page of another site cannot send the
token), so the origin rules cost nothing there and hold in every mode:

- A POST, PUT, PATCH or DELETE with `Sec-Fetch-Site: cross-site` or `same-site` is a 403: the
  chat page's own requests are same-origin, and another port of localhost is "same-site".
- So is one whose `Origin` is not this request's own `Host` (a browser without Sec-Fetch-*
  still sends Origin on a POST; `null` comes from sandboxed and opaque pages). A client that
  is not a browser sends neither header and is not affected.
- With --insecure-dev, a Host that is not 127.0.0.1, localhost or [::1] (with any port) is a
  400: the service was bound to loopback, so any other name reached it by rebinding.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from pyworker.http.errors import error_response

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
REFUSED_SITES = frozenset({"cross-site", "same-site"})
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})
_DEFAULT_PORTS = {"http": "80", "https": "443"}


class RequestGuard:
    def __init__(self, app: ASGIApp, *, loopback_only: bool) -> None:
        self.app = app
        self.loopback_only = loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = refusal(Headers(scope=scope), scope["method"], loopback_only=self.loopback_only)
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


def refusal(headers: Headers, method: str, *, loopback_only: bool) -> Response | None:
    """The error response for a request refused here, or None to let it through."""
    host = headers.get("host")
    if loopback_only and not is_loopback_host(host):
        return error_response(
            400,
            "invalid_host",
            f"Host {_shown(host)} is not this server: --insecure-dev answers only 127.0.0.1, "
            "localhost or [::1] (with its port), as any other name reaching a loopback-only "
            "service is a page of another site rebinding its DNS to it",
        )
    if method not in STATE_CHANGING:
        return None
    site = headers.get("sec-fetch-site")
    if site in REFUSED_SITES:
        return error_response(
            403,
            "cross_site_request",
            f"Sec-Fetch-Site: {site}: a page of another site may not {method} here (the chat "
            "page's own requests are same-origin); a client that is not a browser sends no "
            "Sec-Fetch-Site",
        )
    origin = headers.get("origin")
    if origin is not None and not same_host(origin, host):
        return error_response(
            403,
            "cross_origin_request",
            f"Origin {_shown(origin)} is not this server (Host {_shown(host)}): a page of another "
            f"origin may not {method} here; a proxy in front must pass the Host header on",
        )
    return None


def is_loopback_host(host: str | None) -> bool:
    if not host:
        return False
    name, port = _split_host(host.lower())
    return name in LOOPBACK_NAMES and (port is None or port.isdigit())


def same_host(origin: str, host: str | None) -> bool:
    """Origin's host and port are the Host header's, a scheme's default port given or not."""
    if not host:
        return False
    try:
        parts = urlsplit(origin.lower())
    except ValueError:
        return False
    default = _DEFAULT_PORTS.get(parts.scheme)
    if default is None or not parts.netloc or parts.path or parts.query or parts.fragment:
        return False  # `null`, or not an origin at all

    def normalized(netloc: str) -> tuple[str, str | None]:
        name, port = _split_host(netloc)
        return name, None if port == default else port

    return normalized(parts.netloc) == normalized(host.lower())


def _split_host(value: str) -> tuple[str, str | None]:
    """`name:port` (an IPv6 name in brackets) -> (name, port or None)."""
    if value.startswith("["):
        name, _, rest = value.partition("]")
        return f"{name}]", rest[1:] if rest.startswith(":") else None
    name, colon, port = value.rpartition(":")
    return (name, port) if colon else (value, None)


def _shown(value: str | None) -> str:
    return "(none)" if value is None else repr(value[:100])
