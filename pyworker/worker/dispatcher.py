"""The dispatcher: claim runs only into free slots, and idle-wait on the enqueue channel.

A slot is acquired BEFORE claiming, so a saturated worker never claims a run it cannot start
(the run stays queued, visible, for a worker with room). With several slots free, one
claim_runs call fills them (one transaction, not one per run) and the unused slots go back;
slots that runs ended together (one group flush of the journal writer) are about to free are
waited for, a few event-loop turns, so the claim takes them all.
The idle wait is a NOTIFY on runrow_enqueued with the poll tick as its timeout: the tick is
the fallback ceiling when a wake is lost or the hub is down.

Runs in flight are keyed by claim (run id, claim token): a worker paused past its lease may
claim its own run again while the stale attempt is still standing down, and the stale one's
ending must not take the new one out of the books (drain, cancels). A cancel names only the
run, so it reaches every claim of that run here.

Runs also come to the dispatcher with the endings of others: a journal flush that ends runs
asks it (it is the writer's `rider`) how many successors to claim in the same transaction, one
commit for both (pyworker/worker/journal.py). It asks for as many as the flush ends, only
while the last claim found runs enough (a backlog; an idle worker claims on the wake, as
before), and never once the worker is draining. Such runs start at once in the slots the ended
runs are about to free: each one handed over spares a later slot release (`_handed`), so runs
in flight exceed the concurrency only for the few turns an ended run takes to wind down. A drain
waits for the rides in flight, so their runs are in hand before it counts what to wait for.

A claim whose COMMIT went unanswered (the database restarted under it) may have claimed runs
nobody would work on until their lease lapsed. So claim_runs runs in a transaction of its own:
its rows (run ids and claim tokens) are in hand before the COMMIT, and if the COMMIT goes
unanswered a heartbeat on each asks the fence which of them are ours (pyworker/db/retry.py).
That takes two round trips, BEGIN with the claim and then the COMMIT; sending the COMMIT with
them (a pipeline) would save one, but the server could then commit a claim whose rows never
reached the worker, and those runs would sit claimed by nobody for a lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any
from uuid import UUID

from psycopg_pool import AsyncConnectionPool

from pyworker.db import api, channels
from pyworker.db.aio import within
from pyworker.db.api import ClaimedRun
from pyworker.db.hub import RECONNECT_WAKE, Hub
from pyworker.db.retry import DatabaseUnavailable, Retry, is_transient, outcome_unknown
from pyworker.worker import metrics
from pyworker.worker.handler import RunHandler
from pyworker.worker.journal import JournalWriter
from pyworker.worker.supervisor import RunSupervisor

log = logging.getLogger("runrow.dispatcher")

MAX_CLAIM_BATCH = 1000  # claim_runs' own limit on max_runs
SETTLE_TURNS = 8  # event-loop turns a supervisor takes from its ending to freeing its slot, with room


class Dispatcher:
    def __init__(
        self,
        *,
        pool: AsyncConnectionPool,
        hub: Hub | None,
        writer: JournalWriter,
        handler: RunHandler,
        concurrency: int,
        lease_seconds: int,
        poll_seconds: float,
        worker_id: str,
        config: dict[str, Any] | None = None,
        heartbeat_pool: AsyncConnectionPool | None = None,
    ) -> None:
        self._pool = pool
        self._heartbeat_pool = heartbeat_pool  # None: heartbeats share `pool`
        self._hub = hub
        self._writer = writer
        self._handler = handler
        self._concurrency = concurrency
        self._lease = lease_seconds
        self._poll = poll_seconds
        self.worker_id = worker_id
        self._config = config or {}
        self._slots = asyncio.Semaphore(concurrency)
        self.in_flight: dict[tuple[UUID, UUID], tuple[RunSupervisor, asyncio.Task[str | None]]] = {}
        self.claimed = 0  # runs claimed by this dispatcher (observability, tests)
        self.claims = 0  # claim_runs calls that claimed something (observability, tests)
        self._stopping = False
        self._parked = False  # True while waiting for a slot or a wake: safe to cancel at once
        self._task: asyncio.Task[None] | None = None
        self._backlog = False  # the last claim got every run it asked for: there may be more
        self._handed = 0  # runs started in the slots of ended runs that have not freed them yet
        self._rides = 0  # claims riding journal flushes, not yet handed over
        self._no_rides = asyncio.Event()
        self._no_rides.set()
        self._doubts: set[asyncio.Task[None]] = set()
        writer.rider = self

    async def start(self) -> None:
        self._task = asyncio.create_task(self._claim_loop(), name="runrow-dispatcher")
        self._task.add_done_callback(_log_crash)

    @property
    def lease_seconds(self) -> int:
        return self._lease

    async def stop_claiming(self) -> None:
        """Phase 1 of a drain: no claim starts after this returns. A claim already in flight is
        allowed to finish (cancelling it could lose a committed claim); its runs start normally,
        and so do those of claims riding journal flushes."""
        self._stopping = True
        task = self._task
        if task is not None:
            if self._parked:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._no_rides.wait()

    # --- claims riding the journal writer's flushes of endings (ClaimRider)

    def ride(self, endings: int) -> int:
        if self._stopping or not self._backlog or endings < 1:
            return 0
        self._rides += 1
        self._no_rides.clear()
        return min(endings, self._concurrency, MAX_CLAIM_BATCH)

    def take_claimed(self, runs: list[ClaimedRun], asked: int) -> None:
        self._backlog = len(runs) >= asked
        self._adopt(runs)
        self._ridden()

    def take_in_doubt(self, runs: list[ClaimedRun]) -> None:
        async def settle() -> None:
            try:
                self._adopt(await self._ours(runs))
            except Exception:  # the rest are left to the reaper, as _ours leaves them
                log.exception("claim in doubt: %d run(s) not read back", len(runs))
            finally:
                self._ridden()

        task = asyncio.create_task(settle(), name="runrow-claim-read-back")
        self._doubts.add(task)
        task.add_done_callback(self._doubts.discard)

    def ride_missed(self) -> None:
        self._ridden()

    def _ridden(self) -> None:
        self._rides -= 1
        if self._rides == 0:
            self._no_rides.set()

    def _adopt(self, runs: list[ClaimedRun]) -> None:
        self.claims += bool(runs)
        for run in runs:
            self._handed += 1
            self._start(run)

    def tasks(self) -> list[asyncio.Task[str | None]]:
        return [task for _, task in self.in_flight.values()]

    def supervisors(self, run_id: UUID) -> list[RunSupervisor]:
        """Every claim of this run in flight here (more than one only while a stale attempt stands down)."""
        return [sup for (claimed, _), (sup, _) in self.in_flight.items() if claimed == run_id]

    async def _claim_loop(self) -> None:
        async with self._subscribe(channels.ENQUEUED) as wakes:
            while not self._stopping:
                self._parked = True
                try:
                    await self._slots.acquire()
                finally:
                    self._parked = False
                if self._stopping:
                    self._slots.release()
                    return
                n = await self._more_slots(1)
                _drain(wakes)  # a wake after this point means "claim again", not "already seen"
                runs: list[ClaimedRun] = []
                try:
                    runs = await self._claim(n)
                except Exception as exc:
                    log.warning("claim failed, retrying after the poll tick: %s", exc)
                for _ in range(n - len(runs)):
                    self._slots.release()
                self._backlog = len(runs) == n
                self.claims += bool(runs)
                for run in runs:
                    self._start(run)
                if len(runs) < n and not self._stopping:
                    self._parked = True
                    try:
                        await within(wakes.get(), self._poll)
                    finally:
                        self._parked = False

    async def _more_slots(self, n: int) -> int:
        """Take every slot that is free, or about to be: runs ended by one group flush wind
        down over a few turns of the event loop, so a claim made on the first freed slot would
        claim one run at a time. Waiting those turns (no clock involved) lets one claim_runs
        fill all of them."""
        cap = min(self._concurrency, MAX_CLAIM_BATCH)
        for _ in range(SETTLE_TURNS):
            while n < cap and not self._slots.locked():
                await self._slots.acquire()
                n += 1
            if n >= cap or not self.in_flight:
                break
            await asyncio.sleep(0)
        return n

    async def _claim(self, n: int) -> list[ClaimedRun]:
        claimed: list[ClaimedRun] = []
        try:
            async with self._pool.connection() as conn:
                try:
                    claimed = await api.begin_claim_runs(conn, self.worker_id, n, self._lease)
                except BaseException:
                    with contextlib.suppress(Exception):  # a lost connection rolls back by itself
                        await conn.rollback()
                    raise
                await conn.commit()
        except Exception as exc:
            if not (claimed and is_transient(exc) and outcome_unknown(exc)):
                raise
            log.warning("claim of %d run(s): COMMIT unanswered (%s); asking the fence", len(claimed), exc)
            return await self._ours(claimed)
        return claimed

    async def _ours(self, claimed: list[ClaimedRun]) -> list[ClaimedRun]:
        """The runs of a claim in doubt that are ours: a heartbeat on a claim that never
        committed says owned = false, on one that did it extends the lease."""
        retry = Retry(self._lease, log)
        ours: list[ClaimedRun] = []
        for run in claimed:
            try:
                hb = await retry.call(
                    self._pool,
                    lambda conn, run=run: api.heartbeat(conn, run.run_id, run.claim_token, self._lease),  # type: ignore[misc]
                    f"claim read-back of run {run.run_id}",
                )
            except DatabaseUnavailable:
                return ours  # the rest are left to the reaper
            if hb.owned:
                ours.append(run)
        log.warning("claim in doubt: %d of %d run(s) had been claimed", len(ours), len(claimed))
        return ours

    def _start(self, run: ClaimedRun) -> None:
        self.claimed += 1
        metrics.claimed(run.queued_seconds)
        sup = RunSupervisor(
            run,
            pool=self._pool,
            writer=self._writer,
            handler=self._handler,
            lease_seconds=self._lease,
            worker_id=self.worker_id,
            config=self._config,
            heartbeat_pool=self._heartbeat_pool,
        )
        task = asyncio.create_task(sup.supervise(), name=f"run-{run.run_id}")
        claim = (run.run_id, run.claim_token)
        self.in_flight[claim] = (sup, task)

        def done(t: asyncio.Task[str | None]) -> None:
            self.in_flight.pop(claim, None)
            if self._handed:
                self._handed -= 1  # its slot already holds a run handed over by a journal flush
            else:
                self._slots.release()
            if not t.cancelled() and t.exception() is not None:
                sup.log.error("run supervisor crashed", exc_info=t.exception())

        task.add_done_callback(done)

    async def watch_cancels(self) -> None:
        """The fast cancel path: runrow_cancel carries the run id. After a hub reconnect every
        run beats at once, because a cancel NOTIFY may have been lost while it was down."""
        async with self._subscribe(channels.CANCEL) as queue:
            while True:
                payload = await queue.get()
                if payload == RECONNECT_WAKE:
                    for sup, _ in list(self.in_flight.values()):
                        sup.poke()
                    continue
                with contextlib.suppress(ValueError):
                    for sup in self.supervisors(UUID(payload)):
                        sup.request_cancel()

    @contextlib.asynccontextmanager
    async def _subscribe(self, channel: str):  # type: ignore[no-untyped-def]
        if self._hub is None:
            yield asyncio.Queue()  # never woken: plain polling
        else:
            async with self._hub.subscribe(channel) as queue:
                yield queue


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.critical("the claim loop crashed; this worker claims nothing more", exc_info=task.exception())


def _drain(queue: asyncio.Queue[str]) -> None:
    while not queue.empty():
        queue.get_nowait()
