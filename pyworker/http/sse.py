"""Server-Sent Events over the shared tail (pyworker.db.tail): the stream is only a reader.

Each journal event is one frame: `id:` its seq (the resume cursor), `event:` its type (when
it is a plain name: EVENT_NAME), `data:` its payload JSON. Every event is relayed as is,
`superseded` included: the client drops the deltas it names (README, "The journal's events").
Quiet stretches get a `: keepalive` comment so proxies keep the pipe open. A client that
disconnects ends its tail and nothing else: disconnect is not stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from pyworker.db.api import Event
from pyworker.db.hub import Hub
from pyworker.db.tail import Keepalive, tail
from pyworker.http import metrics as http_metrics
from pyworker.http.errors import error_response

log = logging.getLogger("runrow.http")

KEEPALIVE = b": keepalive\n\n"
# The last frame of a stream the server ends as it shuts down, before the response's clean end.
STOPPING = b": stopping: this server is shutting down; resume with Last-Event-ID\n\n"
RETRY_MS = 2000  # reconnect delay suggested to EventSource clients
# no-store, not no-cache: the stream is one user's conversation, for no cache to keep.
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


@dataclass
class StreamStats:
    """Streams open right now in this process (observability, tests), per user."""

    by_user: dict[str, int] = field(default_factory=dict)

    @property
    def open(self) -> int:
        return sum(self.by_user.values())


# The event types an `event:` line carries; any other is sent without one (a `message` event
# whose data, the event object, still holds the real type). `comp\r\nlete` was framed with its
# CR and LF deleted, as `event: complete`, a forged end that made clients stop reading (the web
# audit); the SQL writers now refuse a type with a control character, but a journal written
# before keeps its rows, and a type may still hold spaces or a slash. Deleting or replacing
# characters always risks making a name it is not.
EVENT_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def frame(event: Event) -> bytes:
    # json.dumps escapes CR and LF inside strings, so data fits on one line.
    data = json.dumps(event.payload, ensure_ascii=False, separators=(",", ":"))
    if EVENT_NAME.fullmatch(event.type) is None:
        return f"id: {event.seq}\ndata: {data}\n\n".encode()
    return f"id: {event.seq}\nevent: {event.type}\ndata: {data}\n\n".encode()


async def event_frames(
    pool: AsyncConnectionPool,
    hub: Hub | None,
    run_id: UUID,
    from_seq: int,
    keepalive: float,
    poll: float,
    *,
    replica: bool = False,
) -> AsyncIterator[bytes]:
    yield f"retry: {RETRY_MS}\n\n".encode()
    items = tail(
        pool, hub, run_id, from_seq=from_seq, keepalive=keepalive, poll_interval=poll, replica=replica
    )
    async with aclosing(items) as stream:
        async for item in stream:
            yield KEEPALIVE if isinstance(item, Keepalive) else frame(item)


class EventStreamResponse(StreamingResponse):
    """Streams frames until they end or the client goes away, whichever is first.

    Starlette's StreamingResponse notices a disconnect only on some servers (ASGI spec < 2.4)
    or at the next write; a tail that waits 15 s between keepalives should end at once.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncIterator[bytes],
        stats: StreamStats,
        user: str = "",
        max_per_user: int = 0,
        stopping: asyncio.Event | None = None,
    ) -> None:
        super().__init__(frames, status_code=200, headers=HEADERS, media_type=self.media_type)
        self._frames = frames
        self._stats = stats
        self._user = user
        self._max_per_user = max_per_user  # 0: no limit
        self._stopping = stopping  # set: the server is shutting down, the stream ends now
        self._started = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method") == "HEAD":
            # Starlette answers HEAD on every GET route: the headers GET would send, and no
            # body. Streaming one held the request open, and a tail, until the run ended.
            await self._frames.aclose()  # type: ignore[attr-defined]
            await self._start(send)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        held = self._stats.by_user.get(self._user, 0)
        if self._max_per_user and held >= self._max_per_user:
            # Checked and counted with no await between, so a burst cannot pass the limit. One
            # token held 1,100 streams open (the security audit): each a task, a socket, a tail.
            await self._frames.aclose()  # type: ignore[attr-defined]
            http_metrics.stream_refused()
            await too_many_streams(self._max_per_user)(scope, receive, send)
            return
        self._stats.by_user[self._user] = held + 1
        stream = asyncio.ensure_future(self._stream(send))
        watch = asyncio.ensure_future(_disconnected(receive))
        stop = asyncio.ensure_future(_stopped(self._stopping))
        stopped = False
        try:
            await asyncio.wait({stream, watch, stop}, return_when=asyncio.FIRST_COMPLETED)
            # Ended by the shutdown, with the client still there and the response not over.
            stopped = stop.done() and not stream.done() and not watch.done()
        finally:
            for task in (stream, watch, stop):
                task.cancel()
            try:
                results = await asyncio.gather(stream, watch, stop, return_exceptions=True)
            finally:
                # A second cancellation (shutdown) ends the wait for the tail to close; the
                # place must be freed all the same, or it counts against the user's limit and
                # the open streams for a stream that is gone.
                self._release()
        if stopped:
            await self._end_for_shutdown(send)
        error = results[0]
        if isinstance(error, Exception) and not isinstance(error, OSError):
            log.error("event stream failed: %r", error)

    async def _end_for_shutdown(self, send: Send) -> None:
        """A comment saying why, then the response's clean end: the client reconnects (after
        `retry`) with Last-Event-ID, to another instance, and loses nothing."""
        with contextlib.suppress(OSError):
            if not self._started:
                await self._start(send)
            await send({"type": "http.response.body", "body": STOPPING, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _release(self) -> None:
        left = self._stats.by_user[self._user] - 1
        if left:
            self._stats.by_user[self._user] = left
        else:
            del self._stats.by_user[self._user]

    async def _start(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})

    async def _stream(self, send: Send) -> None:
        await self._start(send)
        self._started = True
        try:
            async with aclosing(self._frames) as frames:  # type: ignore[type-var]
                async for chunk in frames:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except psycopg.OperationalError as exc:
            # The database went away mid-stream (a read waited out the pool). The response is
            # ended cleanly, so the client reconnects with Last-Event-ID after `retry` and
            # loses nothing; it used to be cut mid-chunk ("incomplete chunked read", and
            # uvicorn's "ASGI callable returned without completing response").
            log.warning("event stream ended, the database is unavailable: %s", exc)
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def too_many_streams(limit: int) -> JSONResponse:
    return error_response(
        429,
        "too_many_streams",
        f"this user has {limit} event streams open on this instance, its limit (runrow serve "
        "--max-streams-per-user): close one, or follow runs one after another",
        headers={"Retry-After": "5"},
    )


async def _stopped(stopping: asyncio.Event | None) -> None:
    if stopping is None:
        await asyncio.Future()  # never: no shutdown signal to wait for
    else:
        await stopping.wait()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
