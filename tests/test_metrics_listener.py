"""The worker's (and `runrow serve --metrics-port`'s) minimal /metrics listener: a request line
or header past the reader's 64 KiB limit is answered 431, not an ERROR traceback per connection
in the log (the review of stop 59)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pyworker.worker import metrics


@pytest.mark.parametrize(
    "oversized",
    [
        b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
        b"GET /x HTTP/1.1\r\nX: " + b"b" * 70_000 + b"\r\n\r\n",
    ],
)
def test_an_oversized_request_is_431_and_logs_no_error(
    oversized: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    async def exchange() -> bytes:
        server = await metrics.serve(None, "127.0.0.1", 0)
        host, port = server.sockets[0].getsockname()[:2]
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(oversized)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            await asyncio.sleep(0.1)  # let the server's handler finish (and log, if it would)
            return answer
        finally:
            server.close()
            await server.wait_closed()

    with caplog.at_level(logging.ERROR):
        answer = asyncio.run(exchange())
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
