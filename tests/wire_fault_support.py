"""A PostgreSQL wire proxy on a Unix socket that breaks one connection at a chosen statement,
so a test can make the client lose its connection at an exact point of the protocol:

- `break_at(b"COMMIT", deliver=True)`: the COMMIT reaches the server and commits; its answer
  is swallowed and the client's connection closed. The client sees a lost connection for a
  transaction that did commit (the ambiguous case).
- `break_at(needle, deliver=False)`: the connection closes before the statement reaches the
  server; an open transaction rolls back when its backend sees the end of the connection.

- `hold=True`: the same, but the client is kept waiting (the answer held, or the connection kept
  open) until a cancel request arrives, as psycopg sends when its task is cancelled mid-query.
  `holding` is set once the server has answered (delivered) or the statement was stopped.

Faults fire once each, in the order armed, on the first statement (Parse or simple Query)
containing the needle. Pools through the proxy should set `prepare_threshold=None`: a prepared
statement is executed without sending its text again.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from pyworker.db.cancel_safe_pool import CancelSafePool

CANCEL_REQUEST = (80877102).to_bytes(4, "big")


@dataclass
class _Fault:
    needle: bytes
    deliver: bool
    hold: bool = False


@dataclass(eq=False)  # hashed by identity: kept in a set
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    swallow: bool = False  # the rest of the server's answer is dropped, then both ends close
    hold: bool = False  # ...or kept in `held` until a cancel request comes
    held: list[bytes] = field(default_factory=list)
    stopped: bool = False  # the client's statement was not sent; nothing more is

    def close(self) -> None:
        self.client.close()
        self.server.close()


@dataclass
class FaultProxy:
    target_url: str
    fired: list[str] = field(default_factory=list)
    sent: list[bytes] = field(default_factory=list)  # every client message after startup, in order
    _faults: list[_Fault] = field(default_factory=list)
    _links: set[_Link] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _server: asyncio.AbstractServer | None = None
    _holding: list[_Link] = field(default_factory=list)
    holding: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        params = conninfo_to_dict(self.target_url)
        port = str(params.get("port") or 5432)
        self._target = f"{params['host']}/.s.PGSQL.{port}"
        self._dir = tempfile.mkdtemp(prefix="rrpx-")  # short: socket paths are limited to ~100 bytes
        self._listen = f"{self._dir}/.s.PGSQL.{port}"
        # No SSL or GSS negotiation: every message after the startup packet is typed.
        self.url = make_conninfo(self.target_url, host=self._dir, sslmode="disable", gssencmode="disable")

    def break_at(self, needle: bytes, *, deliver: bool, hold: bool = False) -> None:
        self._faults.append(_Fault(needle, deliver, hold))

    @property
    def armed(self) -> int:
        return len(self._faults)

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=self._listen)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for link in list(self._links):
            link.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        shutil.rmtree(self._dir, ignore_errors=True)

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        s_reader, s_writer = await asyncio.open_unix_connection(self._target)
        link = _Link(c_writer, s_writer)
        self._links.add(link)
        pumps = [
            asyncio.create_task(self._from_client(c_reader, link)),
            asyncio.create_task(self._from_server(s_reader, link)),
        ]
        try:
            # Either end closing closes the other (a cancel request's server side ends first).
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            link.close()
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._links.discard(link)
            self._tasks.discard(task)

    def _fault_for(self, message: bytes) -> _Fault | None:
        if message[:1] not in (b"P", b"Q"):
            return None
        for fault in self._faults:
            if fault.needle in message:
                self._faults.remove(fault)
                self.fired.append(f"{fault.needle.decode()} {'delivered' if fault.deliver else 'dropped'}")
                return fault
        return None

    async def _from_client(self, reader: asyncio.StreamReader, link: _Link) -> None:
        typed = False  # the startup packet has no type byte
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                message = await _read_message(reader, typed)
                if not typed and message[4:8] == CANCEL_REQUEST:
                    self._release()
                if typed:
                    self.sent.append(message)
                typed = True
                if link.stopped:
                    continue
                fault = self._fault_for(message)
                if fault is not None and not fault.deliver:
                    if not fault.hold:
                        link.close()
                        return
                    link.stopped = True
                    self._holding.append(link)
                    self.holding.set()
                    continue
                if fault is not None:
                    link.swallow, link.hold = not fault.hold, fault.hold
                link.server.write(message)
                await link.server.drain()

    async def _from_server(self, reader: asyncio.StreamReader, link: _Link) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                message = await _read_message(reader, True)
                if link.hold:
                    link.held.append(message)
                    if message[:1] == b"Z":
                        self._holding.append(link)
                        self.holding.set()
                    continue
                if link.swallow:
                    # The client sends its next statement only after reading every answer so
                    # far, so all that arrives now answers the faulted one. ReadyForQuery: done.
                    if message[:1] == b"Z":
                        link.close()
                        return
                    continue
                link.client.write(message)
                await link.client.drain()

    def _release(self) -> None:
        """A cancel request came: answer what was held, close what was stopped."""
        for link in self._holding:
            if link.stopped:
                link.close()
            else:
                link.hold = False
                for message in link.held:
                    link.client.write(message)
        self._holding.clear()


async def _read_message(reader: asyncio.StreamReader, typed: bool) -> bytes:
    head = await reader.readexactly(5 if typed else 4)
    length = int.from_bytes(head[-4:], "big")
    return head + await reader.readexactly(length - 4)


@pytest.fixture
async def proxy(worker_db: str) -> AsyncIterator[FaultProxy]:
    p = FaultProxy(worker_db)
    await p.start()
    yield p
    await p.close()


@pytest.fixture
async def faulty_pool(proxy: FaultProxy) -> AsyncIterator[AsyncConnectionPool]:
    """A pool through the proxy; statements never prepared, so the proxy sees every text."""
    p = CancelSafePool(
        proxy.url, min_size=1, max_size=4, kwargs={"autocommit": True, "prepare_threshold": None}, open=False
    )
    await p.open()
    yield p
    await p.close()
