"""uvicorn's server, told to end the event streams when it shuts down (`runrow serve`)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import uvicorn


class Server(uvicorn.Server):
    """uvicorn.Server that calls `begin_shutdown` (the app's) as its shutdown starts (SIGTERM,
    SIGINT), before it waits --shutdown-grace for open requests: an event stream never ends on
    its own, so it waited out the whole grace and was then cancelled half-way."""

    def __init__(self, config: uvicorn.Config, begin_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self._begin_shutdown = begin_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._begin_shutdown()
        await super().shutdown(sockets)


def run(app: Any, **options: Any) -> None:
    """uvicorn.run(app, **options) with this Server, for an app object (no reload, one worker)."""
    server = Server(uvicorn.Config(app, **options), app.begin_shutdown)
    try:
        server.run()
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the SIGINT it shut down on after it; uvicorn.run swallowed it too
