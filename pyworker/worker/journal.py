"""The journal writer: one per worker process, buffering the events of all its runs.

Deltas (`text_delta`, `thinking_delta`, `input_json_delta`) of one stream coalesce in memory:
consecutive deltas with the same type and content-block `index` become one event whose string
field is the concatenation. Buffers are flushed on a 250 ms clock, ALL runs in ONE transaction
(one append_events per run, each in a savepoint), so notifying commits per second do not grow
with the number of runs (SPEC.md, "Performance rules"). A structural event is written through:
`emit` returns once it is committed. A run fenced out in a batch (append_events returns NULL)
loses only its own events, and its `lost` event is set so its supervisor stands down.

Buffers belong to a claim (run id and claim token), not to a run: a worker paused past its
lease can claim its own run again while the stale attempt is still standing down, and the two
attempts' journals must not meet (the stale one's close dropping the new one's buffer left a
completed run with no text in its journal).

A flush whose COMMIT was sent but never answered (the connection died) may or may not have
committed. Retrying blindly would journal the same events twice at new seqs, so the batch is
held "in doubt" and nothing more is written for its run until a read-back settles it:
append_events already told us the exact seqs the batch took, and while the claim is held this
worker is the only one appending this claim's events, so the batch landed iff those seqs now hold
exactly its events. A foreign row (cancel_requested, approval_requested) can only sit there if
ours did not commit. A failure before COMMIT was sent needs no read-back: the server rolls back.

A write-through flush rides out a transient database error (a restart, a failover: see
pyworker/db/retry.py): it flushes again until its events are committed, the run turns out to be
fenced out (RunLost), or the database stays away for the writer's budget (about a lease:
DatabaseUnavailable, and the run is given up quietly). Only a deterministic error is a
JournalError.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool

from pyworker.db import api, nul
from pyworker.db.api import ClaimedRun
from pyworker.db.retry import Retry, is_transient, outcome_unknown
from pyworker.worker import metrics

log = logging.getLogger("runrow.journal")

DELTA_FIELDS = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}
MAX_EVENTS_PER_CALL = 1000  # append_events' own limit
MAX_BYTES_PER_CALL = 3 * 1024 * 1024  # below append_events' 4 MiB limit, leaving room for JSON overhead
MAX_READ_BACK = 10000  # read_events' own page limit


class RunLost(Exception):
    """The claim is gone (reaped, stopped, superseded): stop working on this run, write nothing."""


class JournalError(Exception):
    """Events could not be written (a bad event, or a database error that retrying cannot
    cure); the message says which."""


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
        self.last_seq: int | None = None  # the last seq this claim knows committed
        self._doubt: _Doubt | None = None  # a batch whose COMMIT went unanswered

    @property
    def run_id(self) -> UUID:
        return self.run.run_id

    @property
    def claim(self) -> tuple[UUID, UUID]:
        """What the writer keys this journal by: one attempt of the run, never the run alone."""
        return self.run.run_id, self.run.claim_token

    @property
    def pending(self) -> bool:
        return bool(self._buffer)

    @property
    def in_doubt(self) -> bool:
        """A batch may or may not have committed; nothing more is written until a read-back says."""
        return self._doubt is not None

    async def emit(self, event: dict[str, Any]) -> None:
        """Buffer a delta (coalesced, flushed on the clock) or write a structural event through."""
        kind = event.get("type")
        if not isinstance(kind, str) or not kind or kind == "complete" or kind.startswith("run_"):
            raise ValueError(f'event must have a string "type" that is not reserved, got {kind!r}')
        if nul.MARKER in event:
            raise ValueError(f"event key {nul.MARKER!r} is reserved (the NUL encoding, pyworker/db/nul.py)")
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
        await self._writer.flush(self)

    def close(self) -> None:
        """Done with this claim; anything still buffered is discarded (flush first to keep it)."""
        self._writer.close(self)

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
        n = len(json.dumps(nul.encode(event)))  # the size append_events will see
        if chunks[-1] and (len(chunks[-1]) >= MAX_EVENTS_PER_CALL or size + n > MAX_BYTES_PER_CALL):
            chunks.append([])
            size = 0
        chunks[-1].append(event)
        size += n
    return chunks


class _Fenced(Exception):
    pass


@dataclass
class _Doubt:
    """A run's batch inside a transaction whose COMMIT went unanswered: its events, the emit mark
    they cover, and the seqs append_events gave them, per call: (last seq, number of events)."""

    events: list[dict[str, Any]]
    mark: int
    calls: list[tuple[int, int]]

    @property
    def first_seq(self) -> int:
        return self.calls[0][0] - self.calls[0][1] + 1

    @property
    def last_seq(self) -> int:
        return self.calls[-1][0]


def _canon(value: Any) -> Any:
    """An event as jsonb gives it back: numbers compare as floats (jsonb keeps 1e308 as the
    exact decimal, which reads back as an int), tuples as lists."""
    if isinstance(value, dict):
        return {str(k): _canon(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canon(v) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return value


async def _landed(conn: psycopg.AsyncConnection[Any], run_id: UUID, doubt: _Doubt) -> bool:
    """Whether the batch committed: its seqs hold exactly its events. If it did not, those seqs
    are empty or hold someone else's rows (a cancel_requested written after our abort)."""
    expected = iter([_canon(json.loads(json.dumps(nul.encode(e)))) for e in doubt.events])
    for last, count in doubt.calls:
        after = last - count
        while after < last:
            rows = await api.read_events(conn, run_id, after, min(last - after, MAX_READ_BACK))
            if not rows:
                return False
            for row in rows:
                if row.seq != after + 1 or _canon(row.payload) != next(expected):
                    return False
                after += 1
    return True


class JournalWriter:
    def __init__(
        self, pool: AsyncConnectionPool, *, interval: float = 0.25, retry_budget: float = 30.0
    ) -> None:
        self._pool = pool
        self._interval = interval
        self._retry = Retry(retry_budget, log)  # a write-through flush through a restart: about a lease
        self._runs: dict[tuple[UUID, UUID], RunJournal] = {}  # by claim: (run id, claim token)
        self._lock = asyncio.Lock()  # one flush at a time keeps each run's events in order
        self._task: asyncio.Task[None] | None = None
        self.ticks = 0  # flush transactions committed (observability, tests)
        # Test hook: hold each flush transaction open this long after its appends, so a test can
        # freeze the process (SIGSTOP) while it holds its runs' row locks. Never set in production.
        self._test_pause = float(os.environ.get("RUNROW_TEST_FLUSH_PAUSE") or 0)

    def run_journal(self, run: ClaimedRun, lost: asyncio.Event | None = None) -> RunJournal:
        journal = RunJournal(self, run, lost if lost is not None else asyncio.Event())
        self._runs[journal.claim] = journal
        return journal

    def close(self, journal: RunJournal) -> None:
        """Forget this claim's journal; anything still buffered is discarded (flush first to
        keep it). Another claim of the same run, older or newer, is not touched."""
        if self._runs.get(journal.claim) is journal:
            del self._runs[journal.claim]

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
            await self.flush_all(pool_timeout=self._retry.budget)

    async def _clock(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.flush_all(pool_timeout=self._retry.budget)
            except Exception as exc:
                log.warning("journal flush failed, retrying on the next tick: %s", exc)

    async def flush(self, journal: RunJournal) -> None:
        """Write through: flush now (every run's buffer rides along, one transaction) and return
        once this journal's events emitted so far are committed."""
        if self._runs.get(journal.claim) is not journal:
            return  # closed
        run_id = journal.run_id
        target = journal._emitted
        tries = self._retry.attempts(f"journal flush of run {run_id}")
        while True:
            try:
                await self.flush_all(pool_timeout=max(0.1, tries.remaining()))
                break
            except psycopg.Error as exc:
                if not is_transient(exc):
                    raise JournalError(f"journal flush failed: {exc}") from exc
                if journal.lost.is_set():
                    raise RunLost(str(run_id)) from exc
                await tries.failed(exc)  # DatabaseUnavailable once the budget is spent
        tries.succeeded()
        if journal._committed >= target:
            return
        if journal.lost.is_set():
            raise RunLost(str(run_id))
        if journal.failed is not None:
            raise JournalError(
                f"journal of run {run_id} rejected events: {journal.failed}"
            ) from journal.failed

    async def flush_all(self, pool_timeout: float | None = None) -> None:
        """One transaction for every run with buffered events. Batches left in doubt by an
        unanswered COMMIT are settled first (raises while the database is unreachable).
        `pool_timeout`: the longest wait for a pool connection (the pool's own by default)."""
        async with self._lock:
            await self._settle_doubts(pool_timeout)
            batch = [
                (j, *j._take())
                for j in list(self._runs.values())
                if j.pending and not j.lost.is_set() and not j.in_doubt
            ]
            if not batch:
                return
            written: list[tuple[RunJournal, _Doubt]] = []  # in doubt only if the COMMIT goes unanswered
            fenced: list[RunJournal] = []
            rejected: list[tuple[RunJournal, Exception]] = []
            committing = False
            started = time.monotonic()
            try:
                async with self._pool.connection(pool_timeout) as conn, conn.transaction():
                    for journal, events, mark in batch:
                        try:
                            async with conn.transaction():  # savepoint: a bad run loses only its own events
                                calls: list[tuple[int, int]] = []
                                for chunk in _chunks(events):
                                    seq = await api.append_events(
                                        conn, journal.run_id, journal.run.claim_token, chunk
                                    )
                                    if seq is None:
                                        raise _Fenced
                                    calls.append((seq, len(chunk)))
                            written.append((journal, _Doubt(events, mark, calls)))
                        except _Fenced:
                            fenced.append(journal)
                        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
                            rejected.append((journal, exc))
                    if self._test_pause and written:
                        log.warning(
                            "test hook: flush transaction paused for %.1fs before COMMIT", self._test_pause
                        )
                        await asyncio.sleep(self._test_pause)
                    committing = True  # from here on a failure may come after the commit took effect
            except BaseException as exc:
                if not committing or not written or not outcome_unknown(exc):
                    for journal, events, mark in batch:
                        journal._restore(events, mark)
                    raise
                # The COMMIT went unanswered: hold the written batches in doubt (a cancelled
                # flush leaves them for the next one to settle).
                for journal, doubt in written:
                    journal._doubt = doubt
                undecided = {*fenced, *(journal for journal, _ in rejected)}
                try:
                    if not isinstance(exc, Exception):
                        raise
                    log.warning("journal flush: COMMIT unanswered (%s); reading the journal back", exc)
                    if not await self._settle_doubts(pool_timeout):
                        raise  # it did not commit: the batches are back in their buffers
                except BaseException:
                    # Fenced and rejected runs are decided again by the retry.
                    for journal, events, mark in batch:
                        if journal in undecided:
                            journal._restore(events, mark)
                    raise
                # It committed, and with it the fenced and rejected verdicts of that transaction.
                self.ticks += 1
                self._stand_down(fenced, rejected)
                return
            self.ticks += 1
            metrics.journal_flushed(sum(len(events) for _, events, _ in batch), time.monotonic() - started)
            for journal, done in written:
                journal._committed = done.mark
                journal.last_seq = done.last_seq
            self._stand_down(fenced, rejected)

    def _stand_down(self, fenced: list[RunJournal], rejected: list[tuple[RunJournal, Exception]]) -> None:
        metrics.fenced("append_events", len(fenced))
        for journal in fenced:
            log.warning("run %s fenced out of its journal: the claim is lost", journal.run_id)
            journal._buffer, journal._marks = [], []
            journal.lost.set()
        for journal, exc in rejected:
            log.error("run %s: journal events rejected: %s", journal.run_id, exc)
            journal.failed = exc

    async def _settle_doubts(self, pool_timeout: float | None = None) -> bool:
        """Read back every batch in doubt on a fresh connection: landed → committed, else back
        in front of the buffer for the retry. True if any landed (that transaction committed)."""
        doubtful = [j for j in self._runs.values() if j._doubt is not None]
        if not doubtful:
            return False
        landed_any = False
        async with self._pool.connection(pool_timeout) as conn:
            for journal in doubtful:
                doubt = journal._doubt
                assert doubt is not None
                landed = await _landed(conn, journal.run_id, doubt)
                journal._doubt = None
                if landed:
                    journal._committed = max(journal._committed, doubt.mark)
                    journal.last_seq = doubt.last_seq
                    landed_any = True
                else:
                    journal._restore(doubt.events, doubt.mark)
                log.warning(
                    "run %s: batch in doubt at seq %s %s",
                    journal.run_id,
                    doubt.first_seq,
                    "had committed" if landed else "had not committed; writing it again",
                )
        return landed_any
