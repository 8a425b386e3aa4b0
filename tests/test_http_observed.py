"""call_noting_status (the access log's and the request metrics' status): a client that left
mid-body is noted as no response (0, the metrics' status="none"), not the 400 the app then wrote
to nobody (the review of stop 59: three cut uploads counted as three 400s)."""

from __future__ import annotations

import asyncio

from starlette.types import Message, Receive, Scope, Send

from pyworker.http.observed import call_noting_status


async def reads_the_body_then_answers(scope: Scope, receive: Receive, send: Send) -> None:
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            status = 400  # as Starlette's request.body() does: ClientDisconnect, a 400 nobody reads
            break
        body += message.get("body", b"")
        if not message.get("more_body"):
            status = 200
            break
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def _noted(messages: list[Message]) -> int:
    incoming = iter(messages)
    noted: list[int] = []

    async def receive() -> Message:
        return next(incoming)

    async def send(message: Message) -> None:
        pass

    scope: Scope = {"type": "http", "method": "POST", "path": "/"}
    asyncio.run(call_noting_status(reads_the_body_then_answers, scope, receive, send, noted.append))
    return noted[0]


def test_a_client_that_left_mid_body_is_noted_as_no_response() -> None:
    cut = [{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}]
    assert _noted(cut) == 0


def test_a_whole_body_is_noted_with_its_status() -> None:
    assert _noted([{"type": "http.request", "body": b"{}", "more_body": False}]) == 200
