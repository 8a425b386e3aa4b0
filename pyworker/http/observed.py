"""Running an ASGI app while noting the status its client got (the access log, the metrics)."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send


async def call_noting_status(
    app: ASGIApp, scope: Scope, receive: Receive, send: Send, ended: Callable[[int], None]
) -> None:
    """app(scope, receive, send), then ended(status) however it ends: the response's status,
    500 when the app raised before a response began (the server answers it so), 0 when the
    client left before any response (also when the app, reading a body the client cut short,
    answered one nobody received)."""
    status = 0
    # The client left before the response began (say, mid-body): the app then answers a 400
    # for a body cut short that nobody reads; noted as 0, the client got nothing.
    left = False

    async def receive_noting_disconnect() -> Message:
        nonlocal left
        message = await receive()
        if message["type"] == "http.disconnect" and not status:
            left = True
        return message

    async def send_noting_status(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    try:
        await app(scope, receive_noting_disconnect, send_noting_status)
    except Exception:
        status = status or 500
        raise
    finally:
        ended(0 if left else status)
