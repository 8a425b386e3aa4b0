"""The journal writer: one per worker process, buffering the events of all its runs.

Deltas (`text_delta`, `thinking_delta`, `input_json_delta`) of one stream coalesce in memory:
consecutive deltas with the same type and content-block `index` become one event whose string
field is the concatenation. Buffers are flushed on a 250 ms clock, ALL runs in ONE transaction
(one append_events per run, each in a savepoint), so notifying commits per second do not grow
with the number of runs (SPEC.md, "Performance rules"). A structural event is written through:
`emit` returns once it is committed. A run fenced out in a batch (append_events returns NULL)
loses only its own events, and its `lost` event is set so its supervisor stands down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool

from pyworker import api
from pyworker.api import ClaimedRun

log = logging.getLogger("runrow.journal")

DELTA_FIELDS = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}
MAX_EVENTS_PER_CALL = 1000  # append_events' own limit
MAX_BYTES_PER_CALL = 3 * 1024 * 1024  # below append_events' 4 MiB limit, leaving room for JSON overhead


class RunLost(Exception):
    """The claim is gone (reaped, stopped, superseded): stop working on this run, write nothing."""


class JournalError(Exception):
    """Events could not be written (bad event or database trouble); the message says which."""


def is_delta(event: dict[str, Any]) -> bool:
    return event.get("type") in DELTA_FIELDS


class RunJournal:
    """The journal of one claimed run. Obtain it from `JournalWriter.run_journal(run)`."""

    def __init__(self, writer: JournalWriter, run: ClaimedRun, lost: asyncio.Event) -> None:
        self._writer = writer
        self.run = run
        self.lost = lost
        self._buffer: list[dict[str, Any]] = []
        self._marks: list[int] = []  # per buffered event: the number of the last emit merged into it
        self._emitted = 0
        self._committed = 0
        self.failed: BaseException | None = None
        self.last_seq: int | None = None

    @property
    def run_id(self) -> UUID:
        return self.run.run_id

    @property
    def pending(self) -> bool:
        return bool(self._buffer)

    async def emit(self, event: dict[str, Any]) -> None:
        """Buffer a delta (coalesced, flushed on the clock) or write a structural event through."""
        kind = event.get("type")
        if not isinstance(kind, str) or not kind or kind == "complete" or kind.startswith("run_"):
            raise ValueError(f'event must have a string "type" that is not reserved, got {kind!r}')
        if self.lost.is_set():
            raise RunLost(str(self.run_id))
        self._emitted += 1
        field = DELTA_FIELDS.get(kind)
        last = self._buffer[-1] if self._buffer else None
        if (
            field is not None
            and last is not None
            and last.get("type") == kind
            and last.get("index") == event.get("index")
            and isinstance(last.get(field), str)
            and isinstance(event.get(field), str)
        ):
            last[field] += event[field]
            self._marks[-1] = self._emitted
        else:
            self._buffer.append(dict(event))
            self._marks.append(self._emitted)
        if field is None:
            await self.flush()

    async def flush(self) -> None:
        """Return once everything emitted so far is committed; RunLost if the run was fenced out."""
        await self._writer.flush(self.run_id)

    def _take(self) -> tuple[list[dict[str, Any]], int]:
        events, mark = self._buffer, self._marks[-1]
        self._buffer, self._marks = [], []
        return events, mark

    def _restore(self, events: list[dict[str, Any]], mark: int) -> None:
        # A failed batch goes back in front of whatever was emitted meanwhile; order is kept.
        self._buffer = events + self._buffer
        self._marks = [mark] * len(events) + self._marks


def _chunks(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    chunks: list[list[dict[str, Any]]] = [[]]
    size = 0
    for event in events:
        n = len(json.dumps(event))
        if chunks[-1] and (len(chunks[-1]) >= MAX_EVENTS_PER_CALL or size + n > MAX_BYTES_PER_CALL):
            chunks.append([])
            size = 0
        chunks[-1].append(event)
        size += n
    return chunks


class _Fenced(Exception):
    pass


class JournalWriter:
    def __init__(self, pool: AsyncConnectionPool, *, interval: float = 0.25) -> None:
        self._pool = pool
        self._interval = interval
        self._runs: dict[UUID, RunJournal] = {}
        self._lock = asyncio.Lock()  # one flush at a time keeps each run's events in order
        self._task: asyncio.Task[None] | None = None
        self.ticks = 0  # flush transactions committed (observability, tests)

    def run_journal(self, run: ClaimedRun, lost: asyncio.Event | None = None) -> RunJournal:
        journal = RunJournal(self, run, lost if lost is not None else asyncio.Event())
        self._runs[run.run_id] = journal
        return journal

    def close(self, run_id: UUID) -> None:
        """Forget the run; anything still buffered is discarded (flush first to keep it)."""
        self._runs.pop(run_id, None)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._clock(), name="runrow-journal")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(Exception):
            await self.flush_all()

    async def _clock(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.flush_all()
            except Exception as exc:
                log.warning("journal flush failed, retrying on the next tick: %s", exc)

    async def flush(self, run_id: UUID) -> None:
        """Write through: flush now (every run's buffer rides along, one transaction) and return
        once this run's events emitted so far are committed."""
        journal = self._runs.get(run_id)
        if journal is None:
            return
        target = journal._emitted
        try:
            await self.flush_all()
        except psycopg.Error as exc:
            raise JournalError(f"journal flush failed: {exc}") from exc
        if journal._committed >= target:
            return
        if journal.lost.is_set():
            raise RunLost(str(run_id))
        if journal.failed is not None:
            raise JournalError(
                f"journal of run {run_id} rejected events: {journal.failed}"
            ) from journal.failed

    async def flush_all(self) -> None:
        """One transaction for every run with buffered events."""
        async with self._lock:
            batch = [(j, *j._take()) for j in list(self._runs.values()) if j.pending and not j.lost.is_set()]
            if not batch:
                return
            written: list[tuple[RunJournal, int, int]] = []
            fenced: list[RunJournal] = []
            rejected: list[tuple[RunJournal, Exception]] = []
            try:
                async with self._pool.connection() as conn, conn.transaction():
                    for journal, events, mark in batch:
                        try:
                            async with conn.transaction():  # savepoint: a bad run loses only its own events
                                seq = None
                                for chunk in _chunks(events):
                                    seq = await api.append_events(
                                        conn, journal.run_id, journal.run.claim_token, chunk
                                    )
                                    if seq is None:
                                        raise _Fenced
                            assert seq is not None
                            written.append((journal, mark, seq))
                        except _Fenced:
                            fenced.append(journal)
                        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
                            rejected.append((journal, exc))
            except Exception:
                for journal, events, mark in batch:
                    journal._restore(events, mark)
                raise
            self.ticks += 1
            for journal, mark, seq in written:
                journal._committed = mark
                journal.last_seq = seq
            for journal in fenced:
                log.warning("run %s fenced out of its journal: the claim is lost", journal.run_id)
                journal._buffer, journal._marks = [], []
                journal.lost.set()
            for journal, exc in rejected:
                log.error("run %s: journal events rejected: %s", journal.run_id, exc)
                journal.failed = exc
