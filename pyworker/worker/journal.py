"""The journal writer: one per worker process, buffering the events of all its runs.

Deltas (`text_delta`, `thinking_delta`, `input_json_delta`) of one stream coalesce in memory:
consecutive deltas with the same type and content-block `index` become one event whose string
field is the concatenation. Buffers are flushed on a 250 ms clock, ALL runs in ONE transaction,
so notifying commits per second do not grow with the number of runs (SPEC.md, "Performance
rules"). A structural event is written through: `emit` returns once it is committed. With
`wait=False` it is written through just the same (a flush starts at once, no clock), but `emit`
returns before the commit, so what the handler emits or ends right after it, in the same burst,
joins that flush: a zero-length run's `message_start`, `message_stop` and ending cost one
finish_runs call, not three transactions (and no write-through task: it starts a loop turn after
the event, and not at all once the run's ending is queued, which carries the events). Its
failure surfaces at the run's next emit, flush or ending (a fence sets `lost` at once). Flushes
are group commits: while one transaction is in flight, every run that asks for a flush joins
the next one, which carries every buffer and every queued run ending (`finish`: the run's
buffered events and its terminal write in one finish_runs call), so ten runs that write
through or end at once cost one transaction. No savepoints on the way: only when a run's data
is refused in a group of several is the group written again with one savepoint per run, so a
run fenced out or refused loses only its own write, and its `lost` event is set (fenced) so
its supervisor stands down.

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
A run ending carried by such a flush is not read back: it is sent again, the fence turns it away
if it had landed, and `finish` says so (maybe_landed) for the supervisor to read the run back.

A flush that ends runs can also claim their successors: the dispatcher, registered as the
writer's `rider`, says how many runs it wants for the slots those endings free, and the flush
calls claim_runs in its own transaction after finish_runs (a flush of endings alone sends BEGIN and
finish_and_claim_runs, which ends the runs and claims their successors in one statement, in one
round trip, then the COMMIT once the claimed rows are in hand): one commit per run ended and
replaced, not two. The claimed runs are handed to the
rider after the COMMIT (or, if it went unanswered, for the fence to say which are ours); a claim
that fails for any other reason is simply not made, and the endings are written again alone.

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
import re
import time
from dataclasses import dataclass, field
from typing import Any, Protocol
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool

from pyworker.db import api, batch, nul
from pyworker.db.api import ClaimedRun
from pyworker.db.retry import DatabaseUnavailable, Retry, is_transient, outcome_unknown
from pyworker.worker import metrics

log = logging.getLogger("runrow.journal")

# The types runrow's SQL journals itself. Tails and UIs read them as the database's word (a stop
# pending, an approval, a spent budget), so a handler may not emit them. The SQL writers reserve
# only complete and run_*: testing six more names in their fast pass cost 1.2-1.6% of the backend
# work per run of finish_and_claim_runs at batch 10 (bench.instructions), measured and not kept.
RUNROW_EVENTS = frozenset(
    {
        "complete",
        "user_message_created",
        "cancel_requested",
        "approval_requested",
        "approval_resolved",
        "tool_interrupted",
        "budget_exhausted",
    }
)


# A control character (C0, DEL, C1) in a type: the SQL writers refuse it with 22023
# (functions/_event_rules.sql), and one such event in a group flush would fail every run's
# events in that call, so emit refuses it first, as it refuses runrow's own types.
CONTROL = re.compile("[\x01-\x1f\x7f-\x9f]")

DELTA_FIELDS = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}
MAX_EVENTS_PER_CALL = 1000  # append_events' own limit
MAX_BYTES_PER_CALL = 3 * 1024 * 1024  # below append_events' 4 MiB limit, leaving room for JSON overhead
# append_runs_events: the fewest runs a flush sends through it (fewer go one append_events
# each), its own limit of runs per call, and a bound on one call's size (each run's chunk is
# within the single-run limits above). Its backend instructions per call (bench.api_calls) are
# about 455k fixed plus 180k a run, against 384k a run for append_events: 1.09x at 2 runs,
# 0.77x at 4, 0.58x at 10.
BATCH_MIN_RUNS = 3
BATCH_RUNS_PER_CALL = 1000
BATCH_BYTES_PER_CALL = 16 * 1024 * 1024
MAX_READ_BACK = 10000  # read_events' own page limit
# Event-loop turns a group leader waits for the runs woken with it, and for what a run does
# right after a wait=False event: a zero-length echo run's message_stop and ending reach the
# writer 5-6 turns after its message_start (measured), so 16 leaves room for a slower handler
# or another Python's asyncio; an idle turn costs microseconds (see _lead). A group whose runs
# have all queued their endings stops waiting: nothing more can join it.
GATHER_TURNS = 16


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
        self._ending: _Ending | None = None  # the run's ending, queued for the next group flush
        self._through_mark = 0  # the last emit written through without waiting (wait=False)
        self._through: asyncio.Task[None] | None = None  # that write-through, while in flight
        self._through_soon = False  # a write-through is asked for and starts on the next loop turn
        # A failure the run's own code has not been told of yet: a refused batch (set as the
        # group that refused it commits, so no later group can write past it first) or a
        # wait=False write-through's error. Raised by the next emit, flush or ending, once.
        self._deferred: BaseException | None = None

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
    def writing_through(self) -> bool:
        """A structural event emitted with wait=False is not known committed yet."""
        return self._through_soon or (self._through is not None and not self._through.done())

    @property
    def ending_settled(self) -> bool:
        """The queued ending has its verdict (finished, fenced out or refused)."""
        return self._ending is not None and self._ending.done

    @property
    def in_doubt(self) -> bool:
        """A batch may or may not have committed; nothing more is written until a read-back says."""
        return self._doubt is not None

    async def emit(self, event: dict[str, Any], *, wait: bool = True) -> None:
        """Buffer a delta (coalesced, flushed on the clock) or write a structural event through.

        wait=False: return before the structural event is committed; its flush starts at once
        and takes whatever this claim emits or ends in the next few event-loop turns. Only
        when the handler's next database call goes through `ctx.db` (which waits for it) or
        follows a `flush()`: a call of its own could otherwise journal, park or end the run
        ahead of the event."""
        kind = event.get("type")
        if not isinstance(kind, str) or not kind or kind in RUNROW_EVENTS or kind.startswith("run_"):
            raise ValueError(
                f'event must have a string "type" that is not one runrow journals itself '
                f"(complete, run_*, {', '.join(sorted(RUNROW_EVENTS - {'complete'}))}), got {kind!r}"
            )
        if CONTROL.search(kind):
            raise ValueError(f'event "type" must have no control character, got {kind!r}')
        if nul.MARKER in event:
            raise ValueError(f"event key {nul.MARKER!r} is reserved (the NUL encoding, pyworker/db/nul.py)")
        if self.lost.is_set():
            raise RunLost(str(self.run_id))
        self._raise_deferred()
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
            if wait:
                await self.flush()
            else:
                self._write_soon()

    async def flush(self) -> None:
        """Return once everything emitted so far is committed; RunLost if the run was fenced out."""
        self._raise_deferred()
        await self._writer.flush(self)

    def _raise_deferred(self) -> None:
        exc, self._deferred = self._deferred, None
        if exc is not None:
            raise exc

    def _write_soon(self) -> None:
        self._through_mark = self._emitted
        if not self._through_soon and (self._through is None or self._through.done()):
            self._through_soon = True
            asyncio.get_running_loop().call_soon(self._start_write_through)

    def _start_write_through(self) -> None:
        """The write-through task, one loop turn after the event: by then a run that ends in
        the same burst (a zero-length run's message_start, message_stop and ending) has queued
        its ending, whose flush carries every event emitted before it and whose `finish` raises
        its failure, so it needs no task of its own; nor does a claim already closed, or one
        whose events a flush (ctx.db's, say) has committed meanwhile."""
        self._through_soon = False
        ending = self._ending is not None and not self._ending.done
        if ending or self._committed >= self._through_mark or self._writer._runs.get(self.claim) is not self:
            return
        if self._through is None or self._through.done():
            self._through = asyncio.create_task(self._write_through(), name=f"journal-{self.run_id}")
            self._writer._through.add(self._through)
            self._through.add_done_callback(self._written_through)

    def _written_through(self, task: asyncio.Task[None]) -> None:
        self._writer._through.discard(task)
        if not task.cancelled() and task.exception() is not None:  # _write_through catches all: a bug
            log.error("run %s: journal write-through failed", self.run_id, exc_info=task.exception())
            self._deferred = self._deferred or task.exception()

    async def _write_through(self) -> None:
        """The flush of wait=False events: again while more were emitted during it. Its failure
        reaches the run as an awaited flush's would: a fence has set `lost` (the supervisor
        stops the handler, the ending writes nothing); no database for the writer's budget
        gives the run up the same way (`lost`, nothing more written), as the heartbeat does; a
        refused batch is held for the run's next emit, flush or ending (set by the group that
        refused it); anything else likewise."""
        try:
            while True:
                mark = self._through_mark
                await self._writer.flush(self, report=False)
                if self._through_mark == mark:
                    return
        except RunLost:
            self.lost.set()  # already set by whoever found the fence; said again so it cannot be missed
        except DatabaseUnavailable as exc:
            log.warning("run %s: journal write-through gave up; giving the run up: %s", self.run_id, exc)
            self._deferred = self._deferred or exc
            self.lost.set()
        except Exception as exc:
            log.warning("run %s: journal write-through failed: %s", self.run_id, exc)
            self._deferred = self._deferred or exc

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


class _Chunk(list):  # type: ignore[type-arg]
    """One call's worth of a run's events, with their size as the call's jsonb will hold them."""

    size = 0


def _chunks(events: list[dict[str, Any]]) -> list[_Chunk]:
    """The events nul-encoded as jsonb will hold them, in calls within append_events' limits."""
    chunks = [_Chunk()]
    for raw in events:
        event, n = nul.encode_sized(raw)  # n: the size append_events will see
        last = chunks[-1]
        if last and (len(last) >= MAX_EVENTS_PER_CALL or last.size + n > MAX_BYTES_PER_CALL):
            last = _Chunk()
            chunks.append(last)
        last.append(event)
        last.size += n
    return chunks


# A unit of a group's write: its run's append chunks, and the events riding its ending.
_Planned = tuple["_Unit", list[_Chunk], list[dict[str, Any]]]


def _packed(entries: list[tuple[int, _Unit, _Chunk]]) -> list[list[tuple[int, _Unit, _Chunk]]]:
    """Runs' chunks in append_runs_events calls of at most BATCH_RUNS_PER_CALL runs and
    BATCH_BYTES_PER_CALL bytes (one chunk alone may be up to MAX_BYTES_PER_CALL)."""
    calls: list[list[tuple[int, _Unit, _Chunk]]] = [[]]
    size = 0
    for entry in entries:
        n = entry[2].size
        if calls[-1] and (len(calls[-1]) >= BATCH_RUNS_PER_CALL or size + n > BATCH_BYTES_PER_CALL):
            calls.append([])
            size = 0
        calls[-1].append(entry)
        size += n
    return calls


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


@dataclass
class _Ending:
    """A run's terminal write waiting for the next group flush, which sends it with the run's
    buffered events in one finish_runs call. `maybe_landed`: a flush that carried it went
    unanswered at COMMIT, so a fenced-out retry may be this claim's own ending."""

    status: str
    result: Any
    error: str | None
    finished: bool | None = None
    failure: BaseException | None = None
    maybe_landed: bool = False

    @property
    def done(self) -> bool:
        return self.finished is not None or self.failure is not None


@dataclass
class _Unit:
    """One run's share of a group flush: its taken events (and the emit mark they cover) and
    its ending, if it is finishing."""

    journal: RunJournal
    events: list[dict[str, Any]]
    mark: int
    ending: _Ending | None


@dataclass
class _Outcome:
    """What one group transaction did, applied to the journals only once it has committed."""

    written: list[tuple[RunJournal, _Doubt]] = field(default_factory=list)
    fenced: list[RunJournal] = field(default_factory=list)
    rejected: list[tuple[RunJournal, Exception]] = field(default_factory=list)
    ended: list[tuple[_Unit, bool, int | None]] = field(default_factory=list)
    refused: list[tuple[_Unit, BaseException]] = field(default_factory=list)
    committing: bool = False  # from here on a failure may come after the commit took effect


class ClaimRider(Protocol):
    """Who takes the runs a flush of endings claims (the dispatcher). ride() is asked before
    the flush and says how many runs to claim (0: none); exactly one of take_claimed(),
    take_in_doubt() or ride_missed() follows each ride() that said more than 0."""

    worker_id: str
    lease_seconds: int

    def ride(self, endings: int) -> int: ...

    def take_claimed(self, runs: list[ClaimedRun], asked: int) -> None: ...

    def take_in_doubt(self, runs: list[ClaimedRun]) -> None: ...

    def ride_missed(self) -> None: ...


class _Ride:
    """One flush's claim of successors for its endings: asked of the rider inside the flush's
    transaction, handed over once the COMMIT's outcome is known, exactly once."""

    def __init__(self, rider: ClaimRider) -> None:
        self.rider = rider
        self.asked = 0
        self.claimed: list[ClaimedRun] = []

    def ask(self, endings: int) -> int:
        self.asked = self.rider.ride(endings)
        return self.asked

    async def claim(self, conn: psycopg.AsyncConnection[Any], endings: int) -> None:
        """claim_runs inside the flush's open transaction. Refused (not a lost connection), the
        group is written again without it (_Isolate), so a claim never costs the endings."""
        if not self.ask(endings):
            return
        try:
            rider = self.rider
            self.claimed = await api.claim_runs(conn, rider.worker_id, self.asked, rider.lease_seconds)
        except psycopg.Error as exc:
            if is_transient(exc):
                raise
            raise _Isolate from exc

    def failed(self, exc: BaseException, committing: bool) -> None:
        if not self.asked:
            return
        if self.claimed and committing and outcome_unknown(exc):
            self.rider.take_in_doubt(self.claimed)
        else:
            self.rider.ride_missed()

    def committed(self) -> None:
        if not self.asked:
            return
        try:  # committed: nothing the rider does can undo the endings
            self.rider.take_claimed(self.claimed, self.asked)
        except Exception:
            log.exception("claimed run(s) not started: %s", ", ".join(str(r.run_id) for r in self.claimed))


class _Isolate(Exception):
    """A run's data was refused inside a group that holds several runs: do it again with a
    savepoint per run, so only that run loses its write."""


class JournalWriter:
    def __init__(
        self, pool: AsyncConnectionPool, *, interval: float = 0.25, retry_budget: float = 30.0
    ) -> None:
        self._pool = pool
        self._interval = interval
        self._retry = Retry(retry_budget, log)  # a write-through flush through a restart: about a lease
        self._runs: dict[tuple[UUID, UUID], RunJournal] = {}  # by claim: (run id, claim token)
        self._lock = asyncio.Lock()  # one group in flight at a time keeps each run's events in order
        self._next: asyncio.Future[None] | None = None  # the group that starts when the lock is free
        self._task: asyncio.Task[None] | None = None
        self._through: set[asyncio.Task[None]] = set()  # wait=False write-throughs in flight
        self.ticks = 0  # group transactions committed (observability, tests)
        self.rider: ClaimRider | None = None  # claims the successors of a flush's endings
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
        if self._through:
            await asyncio.wait(list(self._through))  # each catches its own failure
        with contextlib.suppress(Exception):
            await self.flush_all(pool_timeout=self._retry.budget)

    async def _clock(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.flush_all(pool_timeout=self._retry.budget)
            except Exception as exc:
                log.warning("journal flush failed, retrying on the next tick: %s", exc)

    async def flush(self, journal: RunJournal, *, report: bool = True) -> None:
        """Write through: join the next group flush (every run's buffer rides along, one
        transaction) and return once this journal's events emitted so far are committed.
        report=False (a wait=False write-through): a refused batch is not raised here but left
        for the run's next call (journal._deferred)."""
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
        if journal.failed is not None and report:
            refusal, journal._deferred = journal._deferred, None  # told now, not again
            if isinstance(refusal, JournalError):
                raise refusal
            raise JournalError(
                f"journal of run {run_id} rejected events: {journal.failed}"
            ) from journal.failed

    async def finish(
        self, journal: RunJournal, status: str, result: Any = None, error: str | None = None
    ) -> tuple[bool, bool]:
        """End the run in the next group flush, its buffered events first (finish_runs: the
        same fence as finish_run). Returns (finished, maybe_landed): finished False means
        fenced out, and maybe_landed says an earlier flush that carried this ending went
        unanswered at COMMIT, so the caller must read back whether the ending is its own.
        Raises the database's refusal of this run's outcome (or JournalError for its events)."""
        if self._runs.get(journal.claim) is not journal:
            raise RunLost(str(journal.run_id))  # closed: this claim writes nothing more
        if not journal.lost.is_set():
            journal._raise_deferred()  # a wait=False event's failure: the handler's outcome stands on it
        ending = journal._ending
        if ending is None or ending.done:
            ending = journal._ending = _Ending(status, result, error)
        else:  # one left queued by a flush that failed: same run, the caller's latest word
            ending.status, ending.result, ending.error = status, result, error
        tries = self._retry.attempts(f"finish of run {journal.run_id}")
        while not ending.done:
            if journal.lost.is_set():
                return False, ending.maybe_landed
            try:
                await self.flush_all(pool_timeout=max(0.1, tries.remaining()))
            except psycopg.Error as exc:
                if not is_transient(exc):
                    raise
                await tries.failed(exc)  # DatabaseUnavailable once the budget is spent
        tries.succeeded()
        if ending.failure is not None:
            raise ending.failure
        return bool(ending.finished), ending.maybe_landed

    async def flush_all(self, pool_timeout: float | None = None) -> None:
        """Join the next group flush and return once it has committed (or raise its error).

        Group commit: while one group's transaction is in flight, everything that asks for a
        flush joins the one group that starts when it ends, which takes every buffer and ending
        there is then. So N runs writing through at once cost one transaction, not N queued
        behind a lock. A follower whose leader was cancelled leads the next group itself.
        `pool_timeout`: the longest wait for a pool connection (the pool's own by default)."""
        while True:
            group = self._next
            if group is None:
                await self._lead(pool_timeout)
                return
            try:
                await asyncio.shield(group)
                return
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not group.cancelled() or (task is not None and task.cancelling()):
                    raise  # we were cancelled ourselves, not the group's leader

    async def _lead(self, pool_timeout: float | None) -> None:
        group: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        group.add_done_callback(_retrieved)
        self._next = group
        try:
            # A few turns of the event loop before taking the buffers: runs that reach their
            # write-through together (ten handlers started by one claim, woken by one group)
            # arrive a few turns apart, the leader first, and join this group instead of
            # forming the next one. Turns, not a clock: microseconds when nobody else is ready.
            # Once every run here has queued its ending, nothing more can join: go at once.
            for _ in range(GATHER_TURNS):
                await asyncio.sleep(0)
                if self._all_ending():
                    break
            async with self._lock:  # the group in flight ends first: its runs' events go first
                if self._next is group:
                    self._next = None  # whoever asks from now on forms the group after this one
                await self._flush_group(pool_timeout)
        except BaseException as exc:
            if self._next is group:
                self._next = None
            if isinstance(exc, Exception):
                group.set_exception(exc)
            else:
                group.cancel()
            raise
        group.set_result(None)

    def _all_ending(self) -> bool:
        """Every claim here has its ending queued or settled, or is lost: none of them can
        emit anything more, so waiting for more to join the group gains nothing."""
        return all(j._ending is not None or j.lost.is_set() for j in self._runs.values())

    def _units(self) -> list[_Unit]:
        units = []
        for journal in list(self._runs.values()):
            if journal.lost.is_set() or journal.in_doubt:
                continue
            ending = journal._ending if journal._ending is not None and not journal._ending.done else None
            if journal._deferred is not None:
                # A failure the run has not been told of (a refused wait=False batch): its
                # ending, queued meanwhile, stands on events that were not written.
                if ending is not None:
                    ending.failure, journal._deferred = journal._deferred, None
                continue
            if journal.pending:
                events, mark = journal._take()
            elif ending is not None:
                events, mark = [], journal._committed
            else:
                continue
            units.append(_Unit(journal, events, mark, ending))
        return units

    async def _flush_group(self, pool_timeout: float | None) -> None:
        """One transaction for every run with buffered events or a queued ending. Batches left
        in doubt by an unanswered COMMIT are settled first (raises while the database is
        unreachable)."""
        await self._settle_doubts(pool_timeout)
        units = self._units()
        if not units:
            return
        out = _Outcome()
        started = time.monotonic()
        try:
            async with self._pool.connection(pool_timeout) as conn:
                try:
                    await self._write(conn, units, out, isolate=False)
                except _Isolate:
                    out = _Outcome()
                    await self._write(conn, units, out, isolate=True)
        except BaseException as exc:
            unknown = out.committing and outcome_unknown(exc)
            for unit in units:
                if unit.ending is not None:
                    unit.ending.maybe_landed |= unknown
            if not unknown or not out.written:
                for unit in units:
                    unit.journal._restore(unit.events, unit.mark)
                raise
            # The COMMIT went unanswered: hold the written batches in doubt (a cancelled
            # flush leaves them for the next one to settle). Endings are not read back:
            # sent again, the fence turns a landed one away and the caller reads the run.
            for journal, doubt in out.written:
                journal._doubt = doubt
            in_doubt = {journal for journal, _ in out.written}
            try:
                if not isinstance(exc, Exception):
                    raise
                log.warning("journal flush: COMMIT unanswered (%s); reading the journal back", exc)
                if not await self._settle_doubts(pool_timeout):
                    raise  # it did not commit: the batches are back in their buffers
            except BaseException:
                # Fenced, rejected and ending runs are decided again by the retry.
                for unit in units:
                    if unit.journal not in in_doubt:
                        unit.journal._restore(unit.events, unit.mark)
                raise
            # It committed, and with it every verdict of that transaction.
        self.ticks += 1
        metrics.journal_flushed(sum(len(unit.events) for unit in units), time.monotonic() - started)
        for journal, done in out.written:
            journal._committed = max(journal._committed, done.mark)
            journal.last_seq = done.last_seq
        for unit, finished, last_seq in out.ended:
            assert unit.ending is not None
            unit.ending.finished = finished
            if finished:
                unit.journal._committed = max(unit.journal._committed, unit.mark)
                unit.journal.last_seq = last_seq
        for unit, failure in out.refused:
            assert unit.ending is not None
            unit.ending.failure = failure
        self._stand_down(out.fenced, out.rejected)

    async def _write(
        self, conn: psycopg.AsyncConnection[Any], units: list[_Unit], out: _Outcome, *, isolate: bool
    ) -> None:
        """The group's statements, in one transaction (out.committing once only the COMMIT is left). A
        group that is a single finish_runs statement runs as that statement alone (autocommit:
        one round trip), or, with a claim riding it, as BEGIN and finish_and_claim_runs in one
        round trip and then the COMMIT; its unanswered outcome is settled by the fence like
        any ending's. Savepoints only when isolating, after a run's data was refused in a group
        of several (and then no claim rides)."""
        plan: list[_Planned] = []
        for unit in units:
            chunks = _chunks(unit.events) if unit.events else []
            tail = chunks.pop() if unit.ending is not None and chunks and not isolate else []
            plan.append((unit, chunks, tail))
        appends = any(chunks for _, chunks, _ in plan)
        ride = _Ride(self.rider) if self.rider is not None and not isolate else None
        try:
            if not isolate and not appends and not self._test_pause:  # endings only: one statement
                finishing = [(u, tail) for u, _, tail in plan]
                if ride is not None and ride.ask(len(finishing)):
                    await self._end_runs_and_claim(conn, finishing, out, ride)
                else:
                    out.committing = True
                    await self._end_runs(conn, finishing, out, isolate=False)
            else:
                await self._write_group(conn, plan, out, ride, isolate=isolate)
        except BaseException as exc:
            if ride is not None:
                # _Isolate: the server refused and rolled back, even when the COMMIT refused.
                ride.failed(exc, out.committing and not isinstance(exc, _Isolate))
            raise
        if ride is not None:
            ride.committed()

    async def _write_group(
        self,
        conn: psycopg.AsyncConnection[Any],
        plan: list[_Planned],
        out: _Outcome,
        ride: _Ride | None,
        *,
        isolate: bool,
    ) -> None:
        """The group's transaction: appends, endings, and the claim riding them (if any)."""
        async with conn.transaction():
            # Many runs' appends in one append_runs_events call (a round per chunk a run has
            # beyond its first); a few runs', or isolating, one append_events each (inside the
            # run's savepoint when isolating).
            many = sum(1 for _, chunks, _ in plan if chunks) >= BATCH_MIN_RUNS
            together = await self._append_together(conn, plan) if many and not isolate else None
            finishing: list[tuple[_Unit, list[dict[str, Any]]]] = []
            for i, (unit, chunks, tail) in enumerate(plan):
                journal = unit.journal
                try:
                    if together is not None:
                        appended = together[i]
                        if appended is None:
                            raise _Fenced
                        calls = appended
                    else:
                        async with conn.transaction() if isolate else contextlib.nullcontext():
                            calls = []
                            run_id, token = journal.run_id, journal.run.claim_token
                            for chunk in chunks:
                                seq = await api.append_events(conn, run_id, token, chunk, encoded=True)
                                if seq is None:
                                    raise _Fenced
                                calls.append((seq, len(chunk)))
                except _Fenced:
                    out.fenced.append(journal)
                    if unit.ending is not None:
                        out.ended.append((unit, False, None))
                    continue
                except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
                    if not isolate:
                        raise _Isolate from exc
                    out.rejected.append((journal, exc))
                    if unit.ending is not None:
                        failure = JournalError(f"journal of run {journal.run_id} rejected events: {exc}")
                        failure.__cause__ = exc
                        out.refused.append((unit, failure))
                    continue
                if unit.ending is not None:
                    finishing.append((unit, tail))
                elif calls:
                    out.written.append((journal, _Doubt(unit.events, unit.mark, calls)))
            if finishing:
                await self._end_runs(conn, finishing, out, isolate=isolate)
                if ride is not None:
                    await ride.claim(conn, len(finishing))
            if self._test_pause and (out.written or out.ended):
                log.warning("test hook: flush transaction paused for %.1fs before COMMIT", self._test_pause)
                await asyncio.sleep(self._test_pause)
            out.committing = True

    async def _append_together(
        self, conn: psycopg.AsyncConnection[Any], plan: list[_Planned]
    ) -> list[list[tuple[int, int]] | None]:
        """Every run's append chunks through append_runs_events, which fences each run as
        append_events does: one call per round, round r taking each run's r-th chunk (a run
        has more than one only past MAX_EVENTS_PER_CALL events or MAX_BYTES_PER_CALL bytes
        since the last flush). Per plan entry, in order: the (last seq, events) of each of its
        calls, or None once it was fenced out (its later chunks are not sent). A refused
        batch isolates the group, as a refused append_events did."""
        done: list[list[tuple[int, int]] | None] = [[] for _ in plan]
        for r in range(max((len(chunks) for _, chunks, _ in plan), default=0)):
            entries = [
                (i, unit, chunks[r])
                for i, (unit, chunks, _) in enumerate(plan)
                if r < len(chunks) and done[i] is not None
            ]
            for call in _packed(entries):
                appends = [batch.Appends(u.journal.run_id, u.journal.run.claim_token, c) for _, u, c in call]
                try:
                    seqs = await batch.append_runs_events(conn, appends)
                except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
                    raise _Isolate from exc
                for (i, _, chunk), seq in zip(call, seqs, strict=True):
                    calls = done[i]
                    if seq is None:
                        done[i] = None
                    elif calls is not None:
                        calls.append((seq, len(chunk)))
        return done

    async def _end_runs(
        self,
        conn: psycopg.AsyncConnection[Any],
        finishing: list[tuple[_Unit, list[dict[str, Any]]]],
        out: _Outcome,
        *,
        isolate: bool,
    ) -> None:
        """The endings: one finish_runs call for all of them. When isolating, each is tried
        first alone inside a savepoint rolled back (a refused result then costs only its own
        run), and the ones accepted are written by one call."""
        acks = [_ack(unit, tail) for unit, tail in finishing]
        if isolate:
            # Not one savepoint kept per ending: each kept its tenant's budget row locked to the
            # COMMIT (finish_runs takes an unsettled call's reservation out under it), so the
            # rows were taken in this list's order, and two workers isolating endings of tenants
            # A and B listed in opposite orders deadlocked (the review of session 60). A trial
            # rolled back keeps no lock; the one call takes the rows in key order.
            accepted = []
            for ending, ack in zip(finishing, acks, strict=True):
                try:
                    async with conn.transaction(force_rollback=True):
                        await batch.finish_runs(conn, [ack])
                except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
                    out.refused.append((ending[0], exc))
                    continue
                accepted.append((ending, ack))
            # A refusal now (not deterministic after all) fails the flush, which is retried.
            _record_endings(
                [e for e, _ in accepted], await batch.finish_runs(conn, [a for _, a in accepted]), out
            )
            return
        try:
            rows = await batch.finish_runs(conn, acks)
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
            raise _Isolate from exc  # whose outcome it was is found out one savepoint each
        _record_endings(finishing, rows, out)

    async def _end_runs_and_claim(
        self,
        conn: psycopg.AsyncConnection[Any],
        finishing: list[tuple[_Unit, list[dict[str, Any]]]],
        out: _Outcome,
        ride: _Ride,
    ) -> None:
        """The endings and the claim of their successors in one transaction of two round trips
        (BEGIN and finish_and_claim_runs; then COMMIT). A refusal (of a run's outcome, or of the
        claim) is sorted out one savepoint per run, without the claim. The claimed rows are left
        in `ride` for the caller to hand over."""
        acks = [_ack(unit, tail) for unit, tail in finishing]
        rider = ride.rider
        try:
            try:
                rows, ride.claimed = await batch.begin_finish_runs_and_claim(
                    conn, acks, rider.worker_id, ride.asked, rider.lease_seconds
                )
            except BaseException:
                with contextlib.suppress(Exception):  # a lost connection rolls back by itself
                    await conn.rollback()
                raise
            _record_endings(finishing, rows, out)
            out.committing = True
            await conn.commit()
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
            raise _Isolate from exc

    def _stand_down(self, fenced: list[RunJournal], rejected: list[tuple[RunJournal, Exception]]) -> None:
        metrics.fenced("append_events", len(fenced))
        for journal in fenced:
            log.warning("run %s fenced out of its journal: the claim is lost", journal.run_id)
            journal._buffer, journal._marks = [], []
            journal.lost.set()
        for journal, exc in rejected:
            log.error("run %s: journal events rejected: %s", journal.run_id, exc)
            journal.failed = exc
            # What the run emitted while the refused batch was in flight would land behind a
            # gap: events are written in order or not at all. The run hears of it at its next
            # call, unless its ending was refused with the batch (finish raises that).
            journal._buffer, journal._marks = [], []
            told = journal._ending is not None and journal._ending.failure is not None
            if journal._deferred is None and not told:
                refusal = JournalError(f"journal of run {journal.run_id} rejected events: {exc}")
                refusal.__cause__ = exc
                journal._deferred = refusal

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


def _record_endings(
    finishing: list[tuple[_Unit, list[dict[str, Any]]]], rows: list[batch.Finished], out: _Outcome
) -> None:
    """finish_runs' verdicts, one row per ending in order, into the group's outcome."""
    for (unit, _), row in zip(finishing, rows, strict=True):
        out.ended.append((unit, row.finished, row.last_seq))


def _ack(unit: _Unit, events: list[dict[str, Any]]) -> batch.Ack:
    """The run's ending as finish_runs takes it, encoded as finish_run's wrapper would (its
    events come from _chunks, encoded already)."""
    ending, journal = unit.ending, unit.journal
    assert ending is not None
    return batch.Ack(
        run_id=journal.run_id,
        claim_token=journal.run.claim_token,
        status=ending.status,
        result=None if ending.result is None else nul.encode(ending.result),
        error=api.stored_error(ending.error),
        events=events,
    )


def _retrieved(group: asyncio.Future[None]) -> None:
    # A group's failure is raised in its leader; followers may all have gone.
    if not group.cancelled():
        group.exception()
