"""One LISTEN connection per process, multiplexing channels to in-process subscribers.

Signals are hints, rows are truth: a subscriber treats every payload as "something may have
changed" and re-reads rows. So the hub may drop (full queue), lose (connection down) or
duplicate (reconnect wake) signals; every consumer also polls on its own timeout.

A single supervisor task owns the connection and every LISTEN/UNLISTEN: subscribers only
change the in-process subscriber map and nudge the supervisor, so a reconnect (which re-LISTENs
the whole map) can never race a subscribe. The connection must be direct, never through a
pool or a transaction-pooling bouncer: LISTEN needs a session that lives as long as the hub, and
pgbouncer in transaction mode drops notifications without an error. `self_test` catches that
misconfiguration at start (a NOTIFY of our own through the pool that never arrives), says so
in the log, and stands the hub down: no channel is armed, so every subscriber polls at its
poll tick (a tail trusted its waits and showed a stream in bursts 15 s apart, its keepalive),
and nothing more is LISTENed through the pooler (a LISTEN stays behind on the pooler's server
connection for its other clients).

A run's journal channel is notified only while a tail watches the run (runrow.watch_runs), so
the hub registers a watch for every journal channel it listens on, on its own connection right
after the LISTEN (before the subscriber's first read), refreshes them all in one call every
WATCH_REFRESH seconds, asks again soon for a run whose watch is not confirmed yet, and again
after every reconnect. `armed(channel)` tells a subscriber whether it may trust a wait on the
channel; until then it polls.

A queued run answers `queued`: registered, so every write of the run from the registration's
commit on notifies, but a write in flight when it registered (a claim, a cancel) may not have
seen it, and the claim itself notifies no one. `registered(channel)` says so: its subscriber
may back its poll off, because the hub asks again for all queued runs together every
QUEUED_RETRY (one call per hub, whatever the number of runs) and wakes the subscriber when the
run is claimed or ends. Asking every WATCH_RETRY and polling every second made a client waiting
for a queued run to start cost about a transaction a second each (the stream audit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from pyworker.db import api, channels
from pyworker.db.aio import wait_event, within

log = logging.getLogger("runrow.hub")

RECONNECT_WAKE = ""  # payload put into every queue after a reconnect: re-read, something may have changed

# A watch lasts WATCH_SECONDS in the database and is refreshed every WATCH_REFRESH; a
# registration that came back busy is asked again after WATCH_RETRY, queued after QUEUED_RETRY.
WATCH_SECONDS = 60
WATCH_REFRESH = 20.0
WATCH_RETRY = 0.2
# A queued run waits for a claim, which may take minutes in a backlog: asked again this often,
# all queued runs in one call. It bounds how late a claim that writes nothing more is seen (a
# worker's first write after its claim notifies at once).
QUEUED_RETRY = 1.0
# Watch states after which a wait on the channel can be trusted (ended/unknown: nothing more
# will be written; the subscriber's read finds the end or the absence).
ARMED_STATES = frozenset({"watching", "ended", "unknown"})

POOLED_WARNING = "LISTEN URL looks pooled: wakes will wait for the poll tick; pass --listen-url"
SELF_TEST_TIMEOUT = 2.0


class Hub:
    def __init__(
        self,
        conninfo: str,
        *,
        queue_size: int = 64,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        application_name: str = "runrow-hub",
        connect_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self._conninfo = conninfo
        self._queue_size = queue_size
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._application_name = application_name
        self._connect_kwargs = dict(connect_kwargs or {})  # e.g. keepalives (session_limits)
        self._subscribers: dict[str, set[asyncio.Queue[str]]] = {}
        self._listening: set[str] = set()
        # Futures of subscribers waiting for their LISTEN to be in effect; resolved by the supervisor.
        self._nudges: asyncio.Queue[asyncio.Future[None] | None] = asyncio.Queue()
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self.backend_pid: int | None = None
        self.dropped = 0  # payloads dropped on full queues (observability, tests)
        # Journal channels whose watch is confirmed on this connection: loop time of the
        # registration or refresh that confirmed it.
        self._watched: dict[str, float] = {}
        self._watch_failed = False  # watch_runs raised: logged once, subscribers poll
        self._pending_watch: set[str] = set()  # journal channels whose watch came back queued/busy
        # Journal channels whose watch came back queued: loop time of that answer.
        self._queued: dict[str, float] = {}
        self.pooled = False  # the self-test found the LISTEN pooled: stood down for good

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def start(self) -> None:
        if self._task is None and not self.pooled:
            self._task = asyncio.create_task(self._supervise(), name="runrow-hub")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._close()

    def armed(self, channel: str) -> bool:
        """Whether a wait on `channel` can be trusted: connected, and for a run's journal
        channel, its watch confirmed and fresh. Otherwise the subscriber polls."""
        if not self.connected:
            return False
        if channels.run_of_events_channel(channel) is None:
            return True
        confirmed = self._watched.get(channel)
        return confirmed is not None and time.monotonic() - confirmed < WATCH_SECONDS * 0.75

    def registered(self, channel: str) -> bool:
        """Whether `channel`'s run is queued and its watch registered (fresh): a wait on it may
        back off, since the run's writes notify and the hub wakes the subscriber when the run
        leaves the queue, but not be trusted like an armed one (a write in flight when the watch
        was registered may not have seen it)."""
        if not self.connected:
            return False
        asked = self._queued.get(channel)
        return asked is not None and time.monotonic() - asked < WATCH_SECONDS * 0.75

    async def wait_connected(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        return await wait_event(self._connected, timeout)

    @contextlib.asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[asyncio.Queue[str]]:
        """A bounded queue of payloads of `channel`. When the hub is connected, the LISTEN is in
        effect before this returns, so "subscribe, then read rows" loses no wake."""
        queue: asyncio.Queue[str] = asyncio.Queue(self._queue_size)
        subs = self._subscribers.setdefault(channel, set())
        first = not subs  # an UNLISTEN for this channel may be in flight right now: always wait
        subs.add(queue)
        try:
            if (first or channel not in self._listening) and self.connected and self._task is not None:
                done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._nudges.put_nowait(done)
                await done
            yield queue
        finally:
            subs = self._subscribers.get(channel)
            if subs is not None:
                subs.discard(queue)
                if not subs:
                    del self._subscribers[channel]
                    self._nudges.put_nowait(None)

    async def self_test(self, pool: AsyncConnectionPool, timeout: float = SELF_TEST_TIMEOUT) -> bool | None:  # noqa: ASYNC109
        """LISTEN on a fresh private channel, NOTIFY it through `pool` (runrow.notify_probe), and
        wait up to `timeout` for it to arrive. False, with the POOLED_WARNING in the log, when it
        never does: the hub's URL goes through a pooler that drops notifications. None when the
        test could not run (the hub or the pool is down: each logs that on its own)."""
        if not await self.wait_connected(5):
            return None
        channel = f"runrow_probe_{uuid.uuid4().hex}"
        async with self.subscribe(channel) as queue:
            session = self.backend_pid
            if channel not in self._listening:
                return None  # the hub went down meanwhile
            # Two probes, each given `timeout`: one late NOTIFY on a busy host must not stand
            # a direct LISTEN down for the process's whole life.
            for _probe in range(2):
                try:
                    async with pool.connection() as conn:
                        await api.notify_probe(conn, channel)
                except psycopg.Error as exc:
                    log.warning("hub self-test could not NOTIFY through the pool: %s", exc)
                    return None
                deadline = time.monotonic() + timeout
                while (left := deadline - time.monotonic()) > 0:
                    payload = await within(queue.get(), left)
                    if payload is None:
                        break
                    if payload == channel:
                        log.info("hub self-test: NOTIFY through the pool reached the hub")
                        return True
                if self.backend_pid != session:
                    return None  # it reconnected meanwhile and may have missed it: no verdict
        log.warning(
            "%s (a NOTIFY through the pool did not arrive within %.0f s, twice)", POOLED_WARNING, timeout
        )
        await self._stand_down()
        return False

    async def _stand_down(self) -> None:
        """The LISTEN goes through a pooler: stop, UNLISTEN what was listened (best effort: the
        pooler may send it to another server connection), and never reconnect."""
        self.pooled = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._connected.clear()
        self._release_waiters()
        self._wake_everyone()  # a wait begun while armed re-reads, and polls from now on
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.execute("UNLISTEN *")
        await self._close()

    def _deliver(self, channel: str, payload: str) -> None:
        for queue in list(self._subscribers.get(channel, ())):
            try:
                queue.put_nowait(payload)
            except asyncio.QueueFull:
                # A full queue already holds a pending wake; the consumer re-reads rows anyway.
                self.dropped += 1

    def _wake_everyone(self) -> None:
        for channel in list(self._subscribers):
            self._deliver(channel, RECONNECT_WAKE)

    async def _supervise(self) -> None:
        backoff = self._backoff_initial
        while True:
            try:
                await self._connect()
                backoff = self._backoff_initial
                await self._serve()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.connected:
                    log.warning("hub connection lost: %s; consumers fall back to polling", exc)
                else:
                    log.warning("hub cannot connect: %s; retrying", exc)
            self._connected.clear()
            self._release_waiters()
            # A wait begun while its channel was armed trusted the hub to wake it: with the hub
            # down no wake comes, so it re-reads now and polls until the reconnect (it slept
            # until its keepalive or the reconnect, whichever was first: the failover audit).
            self._wake_everyone()
            await self._close()
            delay = backoff * random.uniform(0.5, 1.5)
            backoff = min(backoff * 2, self._backoff_max)
            await asyncio.sleep(delay)

    async def _connect(self) -> None:
        conn = await psycopg.AsyncConnection.connect(
            self._conninfo, autocommit=True, application_name=self._application_name, **self._connect_kwargs
        )
        self._conn = conn
        self._listening = set()
        self._watched = {}
        self._pending_watch = set()
        self._queued = {}
        await self._reconcile(conn)
        self.backend_pid = conn.info.backend_pid
        self._connected.set()
        log.info("hub connected (backend pid %s, %d channels)", self.backend_pid, len(self._listening))
        # Whatever was notified while we were down is lost: tell every subscriber to re-read.
        self._wake_everyone()

    async def _serve(self) -> None:
        conn = self._conn
        assert conn is not None
        while True:
            pump = asyncio.create_task(self._pump(conn))
            nudge = asyncio.create_task(self._nudges.get())
            # The next watch refresh or retry, if any journal channel is listened on.
            due = self._watch_due()
            timer = asyncio.create_task(asyncio.sleep(3600.0 if due is None else due))
            try:
                await asyncio.wait({pump, nudge, timer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not pump.done():
                    pump.cancel()
                if not nudge.done():
                    nudge.cancel()
                if not timer.done():
                    timer.cancel()
                results = await asyncio.gather(pump, nudge, timer, return_exceptions=True)
            waiters = []
            if not nudge.cancelled() and isinstance(results[1], asyncio.Future):
                waiters.append(results[1])
            if isinstance(results[0], Exception):
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(None)
                raise results[0]
            while not self._nudges.empty():
                item = self._nudges.get_nowait()
                if item is not None:
                    waiters.append(item)
            try:
                await self._reconcile(conn)
            finally:
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(None)

    async def _pump(self, conn: psycopg.AsyncConnection[Any]) -> None:
        async for notify in conn.notifies():
            self._deliver(notify.channel, notify.payload)
        raise psycopg.OperationalError("hub notifies() ended")

    async def _reconcile(self, conn: psycopg.AsyncConnection[Any]) -> None:
        # Subscribers come and go while LISTEN/UNLISTEN are awaited: repeat until it holds still.
        while (wanted := set(self._subscribers)) != self._listening:
            for channel in sorted(wanted - self._listening):
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                self._listening.add(channel)
            for channel in sorted(self._listening - wanted):
                if channel not in self._subscribers:
                    await conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel)))
                self._listening.discard(channel)
        await self._watch(conn)

    def _journal_channels(self) -> list[str]:
        return [c for c in self._listening if channels.run_of_events_channel(c) is not None]

    def _watch_due(self) -> float | None:
        """Seconds until the next watch registration or refresh is due; None: nothing to watch."""
        listened = self._journal_channels()
        if not listened:
            return None
        if self._watch_failed:
            return WATCH_REFRESH
        now = time.monotonic()
        due = [
            self._watched[c] + WATCH_REFRESH - now
            if c in self._watched
            else self._queued[c] + QUEUED_RETRY - now
            if c in self._queued
            else WATCH_RETRY
            for c in listened
        ]
        return max(0.0, min(due))

    async def _watch(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Register the journal channels not watched yet and refresh those due, in one call.
        After the LISTEN, so no notification of a write that sees the watch is missed."""
        listened = self._journal_channels()
        for channel in set(self._watched) - set(listened):
            del self._watched[channel]  # unsubscribed: its watch lapses in the database
        for channel in set(self._queued) - set(listened):
            del self._queued[channel]
        now = time.monotonic()
        # A queued run half its retry from due rides along with a call made anyway (a new
        # subscriber's), so that the queued runs stay asked in one call, not one each.
        due = [
            c
            for c in listened
            if (c in self._watched and now - self._watched[c] >= WATCH_REFRESH - WATCH_RETRY)
            or (c in self._queued and now - self._queued[c] >= QUEUED_RETRY / 2)
            or (c not in self._watched and c not in self._queued)
        ]
        if not due:
            return
        runs = [run for c in sorted(due) if (run := channels.run_of_events_channel(c)) is not None]
        try:
            rows = await api.watch_runs(conn, runs, WATCH_SECONDS)
        except psycopg.OperationalError:
            raise  # the connection: the supervisor reconnects
        except psycopg.Error as exc:
            # An older schema (no watch_runs) or a role without the grant: tails poll.
            if not self._watch_failed:
                log.warning("hub cannot watch run journals (%s); run tails fall back to polling", exc)
            self._watch_failed = True
            return
        self._watch_failed = False
        for run, state in rows:
            channel = channels.events_channel(run)
            if state in ARMED_STATES:
                if channel not in self._watched and channel in self._pending_watch:
                    # Its subscriber is polling: a write it was not woken for may be there.
                    self._deliver(channel, RECONNECT_WAKE)
                self._watched[channel] = now
                self._pending_watch.discard(channel)
                self._queued.pop(channel, None)
            else:
                self._watched.pop(channel, None)
                self._pending_watch.add(channel)
                if state == "queued":
                    self._queued[channel] = now
                else:
                    self._queued.pop(channel, None)  # busy (a writer in flight): WATCH_RETRY
        self._pending_watch &= set(listened)

    def _release_waiters(self) -> None:
        # Subscribers waiting for a LISTEN must not hang while the hub is down: they poll.
        while not self._nudges.empty():
            item = self._nudges.get_nowait()
            if item is not None and not item.done():
                item.set_result(None)

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        self._listening = set()
        self._watched = {}
        self._pending_watch = set()
        self._queued = {}
        self.backend_pid = None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
