"""Support for the HTTP service tests: a private database, `runrow serve`'s app on a real
uvicorn server in a background thread (real sockets, real streaming), users with tokens,
and an SSE reader that records every frame."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

from pyworker.db.devdb import temporary_database
from pyworker.http.app import create_app
from pyworker.http.config import OPT_IN_FIELDS, ServeConfig
from pyworker.http.context import Services

TOKENS = {"alice-token-0123456789": "alice", "bob-token-0123456789ab": "bob"}
ALICE = {"Authorization": "Bearer alice-token-0123456789"}
BOB = {"Authorization": "Bearer bob-token-0123456789ab"}


def private_database(database_url: str, prefix: str) -> Iterator[str]:
    with temporary_database(database_url, prefix) as url:
        yield url


class Server:
    """create_app(config) served by uvicorn on a free loopback port, in a thread of its own."""

    def __init__(self, config: ServeConfig) -> None:
        self.app = create_app(config)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        # Keep-alive past any wait a test makes (the stop functions' 5 s lock_timeout, twice over
        # for a stop queued behind another): at uvicorn's default of 5 s the server closed a
        # pooled connection just as the test's next request reused it (ECONNRESET on a POST,
        # which no client retries), the race every client of a keep-alive server has.
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, log_level="warning", lifespan="on", timeout_keep_alive=60)
        )
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="uvicorn", daemon=True
        )

    @property
    def services(self) -> Services:
        return self.app.state.services  # type: ignore[no-any-return]

    def start(self) -> Server:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            assert self._thread.is_alive(), "uvicorn exited during startup"
            assert time.monotonic() < deadline, "uvicorn did not start in 30 s"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(15)
        self._sock.close()


def serve(database_url: str, **overrides: Any) -> Iterator[Server]:
    options: dict[str, Any] = {
        "model": "echo",
        "tokens": TOKENS,
        "keepalive_seconds": 0.5,
        "poll_seconds": 0.2,
        # The tests' users set any field (the echo handler reads metadata); the default, none,
        # is tests/test_http_user_fields.py's.
        "user_may_set": frozenset(OPT_IN_FIELDS),
        # Many tests send bad tokens on purpose from 127.0.0.1; the limit is
        # tests/test_http_auth_throttle.py's.
        "auth_failures_per_minute": 0,
    }
    options.update(overrides)
    server = Server(ServeConfig(database_url=database_url, **options)).start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Frame:
    id: int | None
    event: str | None
    data: Any
    comment: str | None = None


@dataclass
class Stream:
    status: int
    headers: httpx.Headers
    frames: list[Frame] = field(default_factory=list)

    @property
    def events(self) -> list[Frame]:
        return [f for f in self.frames if f.id is not None]

    @property
    def keepalives(self) -> int:
        return sum(1 for f in self.frames if f.comment == "keepalive")


def parse_frames(lines: Iterator[str], stop_after: int | None = None) -> Iterator[Frame]:
    """SSE frames from text lines; a comment line is a frame of its own."""
    fid: int | None = None
    event: str | None = None
    data: list[str] = []
    for line in lines:
        if line.startswith(":"):
            yield Frame(None, None, None, comment=line[1:].strip())
        elif line == "":
            if data or fid is not None:
                yield Frame(fid, event, json.loads("\n".join(data)) if data else None)
            fid, event, data = None, None, []
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "id":
                fid = int(value)
            elif name == "event":
                event = value
            elif name == "data":
                data.append(value)


def read_stream(
    client: httpx.Client,
    run_id: uuid.UUID | str,
    headers: dict[str, str],
    *,
    params: dict[str, Any] | None = None,
    max_events: int | None = None,
    timeout: float = 20,
) -> Stream:
    """GET /runs/{id}/events and read frames until the stream ends or `max_events` events arrived
    (then drop the connection, as a client closing its tab would)."""
    with client.stream(
        "GET", f"/runs/{run_id}/events", headers=headers, params=params, timeout=timeout
    ) as response:
        stream = Stream(response.status_code, response.headers)
        if response.status_code != 200:
            response.read()
            return stream
        for frame in parse_frames(response.iter_lines()):
            stream.frames.append(frame)
            if max_events is not None and len(stream.events) >= max_events:
                break
    return stream


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"type", "message"}, body
    assert body["error"]["message"], body
    return body["error"]  # type: ignore[no-any-return]
