"""A PostgreSQL wire proxy on a Unix socket that breaks one connection at a chosen statement,
so a test can make the client lose its connection at an exact point of the protocol:

- `break_at(b"COMMIT", deliver=True)`: the COMMIT reaches the server and commits; its answer
  is swallowed and the client's connection closed. The client sees a lost connection for a
  transaction that did commit (the ambiguous case).
- `break_at(needle, deliver=False)`: the connection closes before the statement reaches the
  server; an open transaction rolls back when its backend sees the end of the connection.

Faults fire once each, in the order armed, on the first statement (Parse or simple Query)
containing the needle. Pools through the proxy should set `prepare_threshold=None`: a prepared
statement is executed without sending its text again.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from dataclasses import dataclass, field

from psycopg.conninfo import conninfo_to_dict, make_conninfo


@dataclass
class _Fault:
    needle: bytes
    deliver: bool


@dataclass(eq=False)  # hashed by identity: kept in a set
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    swallow: bool = False  # the rest of the server's answer is dropped, then both ends close

    def close(self) -> None:
        self.client.close()
        self.server.close()


@dataclass
class FaultProxy:
    target_url: str
    fired: list[str] = field(default_factory=list)
    _faults: list[_Fault] = field(default_factory=list)
    _links: set[_Link] = field(default_factory=set)
    _server: asyncio.AbstractServer | None = None

    def __post_init__(self) -> None:
        params = conninfo_to_dict(self.target_url)
        port = str(params.get("port") or 5432)
        self._target = f"{params['host']}/.s.PGSQL.{port}"
        self._dir = tempfile.mkdtemp(prefix="rrpx-")  # short: socket paths are limited to ~100 bytes
        self._listen = f"{self._dir}/.s.PGSQL.{port}"
        # No SSL or GSS negotiation: every message after the startup packet is typed.
        self.url = make_conninfo(self.target_url, host=self._dir, sslmode="disable", gssencmode="disable")

    def break_at(self, needle: bytes, *, deliver: bool) -> None:
        self._faults.append(_Fault(needle, deliver))

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
        shutil.rmtree(self._dir, ignore_errors=True)

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        s_reader, s_writer = await asyncio.open_unix_connection(self._target)
        link = _Link(c_writer, s_writer)
        self._links.add(link)
        try:
            await asyncio.gather(self._from_client(c_reader, link), self._from_server(s_reader, link))
        finally:
            link.close()
            self._links.discard(link)

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
                typed = True
                fault = self._fault_for(message)
                if fault is not None and not fault.deliver:
                    link.close()
                    return
                if fault is not None:
                    link.swallow = True
                link.server.write(message)
                await link.server.drain()

    async def _from_server(self, reader: asyncio.StreamReader, link: _Link) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                message = await _read_message(reader, True)
                if link.swallow:
                    # The client sends its next statement only after reading every answer so
                    # far, so all that arrives now answers the faulted one. ReadyForQuery: done.
                    if message[:1] == b"Z":
                        link.close()
                        return
                    continue
                link.client.write(message)
                await link.client.drain()


async def _read_message(reader: asyncio.StreamReader, typed: bool) -> bytes:
    head = await reader.readexactly(5 if typed else 4)
    length = int.from_bytes(head[-4:], "big")
    return head + await reader.readexactly(length - 4)
