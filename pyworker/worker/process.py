"""A worker process: pool, hub, journal writer, dispatcher, cancel watcher, reaper, webhooks, drain.

Drain (SIGTERM or SIGINT): phase 1 stops claiming at once; phase 2 waits for the runs in
flight up to the drain budget; what is left is abandoned: its handler is cancelled and the
run released with error 'drained' — the attempts policy decides (requeued while attempts are
left, otherwise failed), exactly as for any other hand-back. Then exit 0 (1 when a handler
ignored the cancellation too and its run is left to the reaper: pyworker/cli/worker_exit.py).
A second signal exits at once (status 1); the reaper takes those runs after lease + grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout

from pyworker.db import schema
from pyworker.db.cancel_safe_pool import CancelSafePool
from pyworker.db.config import where
from pyworker.db.hub import Hub
from pyworker.db.pooling import POOLER_SAFE, accepted_kwargs_within
from pyworker.db.session_limits import worker_connection_kwargs
from pyworker.worker import early_signals, metrics
from pyworker.worker.dispatcher import Dispatcher
from pyworker.worker.handler import RunHandler
from pyworker.worker.journal import JournalWriter
from pyworker.worker.reaper import reaper_loop
from pyworker.worker.settings import check as check_setting
from pyworker.worker.webhooks import WebhookSettings, webhook_loop

log = logging.getLogger("runrow.worker")

START_TIMEOUT = 30.0  # seconds a starting worker waits for its database (PoolTimeout after)
# Heartbeats are one call per run every lease / 3, apart from the work pool so that they never
# wait behind a handler's long query: 2 connections, and one more per HEARTBEATS_PER_CONNECTION
# runs of concurrency. 1,000 runs at a 30 s lease beat 100 times a second; two connections
# 20 ms from the database carry about that many, with nothing to spare.
HEARTBEAT_POOL_SIZE = 2
HEARTBEATS_PER_CONNECTION = 250
# With --metrics-port, the scrapes' own connection. A scrape borrowed one from the run pool and
# waited out its 5 s whenever handlers held every connection (a pool at --concurrency, as the
# README asks of handlers using ctx.db): db_up 0, a false "database down" exactly when the
# worker was busiest. Not the heartbeats' pool either: a slow scrape there delays beats, and
# that pool has no connection to spare at high concurrency.
METRICS_CONNECTIONS = 1


def heartbeat_pool_size(concurrency: int) -> int:
    """Connections of a worker's heartbeat pool at `concurrency` runs in flight."""
    return HEARTBEAT_POOL_SIZE + concurrency // HEARTBEATS_PER_CONNECTION


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class SchemaMissing(RuntimeError):
    """The database the worker was pointed at has no runrow schema (never migrated)."""


# The work pool, the heartbeats', the scrapes' (None: no --metrics-port), the LISTEN's limits.
_Pools = tuple[CancelSafePool, CancelSafePool, CancelSafePool | None, dict[str, Any]]


class CannotConnect(PoolTimeout):
    """No connection within `seconds` at start; `error`: what the server last answered, if
    anything did (a refusal, such as no connection slots left), so the exit can name it."""

    def __init__(self, seconds: float, error: BaseException | None) -> None:
        super().__init__(f"no connection to the database within {seconds:g} s")
        self.seconds = seconds
        self.error = error


class Worker:
    def __init__(
        self,
        conninfo: str,
        *,
        concurrency: int = 4,
        lease_seconds: int = 30,
        drain_seconds: float = 30.0,
        poll_seconds: float = 10.0,
        reap_interval: float = 15.0,
        grace_seconds: int = 30,
        trim_after: float | None = 24 * 3600,
        handler: RunHandler,
        worker_id: str | None = None,
        config: dict[str, Any] | None = None,
        pool_size: int | None = None,
        flush_interval: float = 0.25,
        session_limits: bool = True,
        listen_conninfo: str | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        webhooks: WebhookSettings | None = None,
    ) -> None:
        settings = {
            "concurrency": concurrency,
            "lease_seconds": lease_seconds,
            "grace_seconds": grace_seconds,
            "poll_seconds": poll_seconds,
            "reap_interval": reap_interval,
            "drain_seconds": drain_seconds,
            "trim_after": trim_after,
            "flush_interval": flush_interval,
            "pool_size": pool_size,
        }
        for name, value in settings.items():
            if value is not None or name not in ("trim_after", "pool_size"):  # None: never trim / the default
                check_setting(name, value)
        for name in ("max_model_calls", "key_error_first_block", "key_error_max_block", "key_error_give_up"):
            if config and name in config:  # read by the agent loop, at every model call
                check_setting(name, config[name])
        self.conninfo = conninfo
        # The hub's LISTEN needs a direct session; the pool may go through a transaction pooler.
        self.listen_conninfo = listen_conninfo or conninfo
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.drain_seconds = drain_seconds
        self.poll_seconds = poll_seconds
        self.reap_interval = reap_interval
        self.grace_seconds = grace_seconds
        self.trim_after = trim_after
        self.handler = handler
        self.worker_id = worker_id or default_worker_id()
        self.config = config or {}
        self.pool_size = pool_size or min(concurrency + 4, 32)
        # Only a size the operator chose is warned of: the default agent loop holds a connection
        # only briefly per step (heartbeats have a pool of their own), so the default pool serves
        # any concurrency, and a warning at every `--concurrency 40` start was a false alarm.
        self.pool_size_given = pool_size is not None
        self.flush_interval = flush_interval
        self.session_limits = session_limits
        self.metrics_port = metrics_port  # None: no metrics endpoint; 0: any free port
        self.metrics_host = metrics_host
        self.metrics_address: tuple[str, int] | None = None  # where /metrics is served
        self.webhooks = webhooks  # None: this worker delivers no webhooks (it has no secret)
        self._stop = asyncio.Event()
        self._signals = 0
        self._refusal: BaseException | None = None  # the start-up probes' last connect error
        self._starting: asyncio.Future[_Pools] | None = None
        self.dispatcher: Dispatcher | None = None
        self.hub: Hub | None = None
        # Runs whose task did not end even when cancelled: asyncio.run would await them for
        # ever at exit, so `runrow worker` exits without them (pyworker/cli/main.py).
        self.unstoppable = 0

    def request_stop(self) -> None:
        self._stop.set()
        if self._starting is not None:
            self._starting.cancel()  # nothing to drain before the database answered

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info(
                "%s: draining (up to %.1fs); a second signal exits at once",
                signal.Signals(signum).name,
                self.drain_seconds,
            )
            self.request_stop()
        else:
            log.warning("second signal: exiting now; the reaper takes the runs left in flight")
            logging.shutdown()
            os._exit(1)

    async def run(self, *, install_signals: bool = True) -> int:
        """Run until stopped: by a signal (when install_signals; a second one exits at once) or
        request_stop(). The handlers stay installed through the drain, and are removed however
        the run ends."""
        if not install_signals:
            return await self._run()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        for signum in early_signals.take():  # those that came while the process was starting
            self._on_signal(signum)
        try:
            return await self._run()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    async def _run(self) -> int:
        # Until the database answers, a first Ctrl-C or SIGTERM ends the wait at once: there is
        # nothing to drain yet. (It waited out the pool's 30 s, or a connect timeout per probe.)
        if self.pool_size_given and self.concurrency > self.pool_size:
            log.warning(
                "concurrency %d exceeds the pool's %d connections: runs beyond it wait for a "
                "connection, and one that waits about a lease (%ds) is given up; raise --pool-size",
                self.concurrency,
                self.pool_size,
                self.lease_seconds,
            )
        if self._stop.is_set():  # stopped while starting: the database was never asked
            log.info("stopped before the database answered: nothing was claimed")
            return 0
        metrics.register_worker()  # the worker's series, in a process that runs one
        log.info("worker %s connecting to %s", self.worker_id, where(self.conninfo))
        self._starting = asyncio.ensure_future(self._connect())
        try:
            pool, heartbeat_pool, metrics_pool, hub_limits = await self._starting
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and self._stop.is_set():
                log.info("stopped before the database answered: nothing was claimed")
                return 0
            raise
        finally:
            self._starting = None
        hub = self.hub = Hub(self.listen_conninfo, connect_kwargs=hub_limits)
        await hub.start()
        await hub.wait_connected(5)  # not required: without it the worker polls
        metrics.watch_hub(lambda: hub.connected)
        metrics_server = None
        background: list[asyncio.Task[Any]] = []
        if metrics_pool is not None:
            metrics_server = await metrics.serve(metrics_pool, self.metrics_host, self.metrics_port or 0)
            self.metrics_address = metrics_server.sockets[0].getsockname()[:2]
            log.info("metrics on http://%s:%d/metrics", *self.metrics_address)
            # Read once before the first claim, so the first runs' model requests are labelled.
            try:
                await metrics.refresh_models(metrics_pool)
            except Exception as exc:
                log.warning("metrics: the priced models were not read (every model counts as other): %s", exc)
            background.append(
                asyncio.create_task(metrics.watch_models(metrics_pool), name="runrow-metrics-models")
            )
        writer = JournalWriter(pool, interval=self.flush_interval, retry_budget=self.lease_seconds)
        await writer.start()
        dispatcher = self.dispatcher = Dispatcher(
            pool=pool,
            hub=hub,
            writer=writer,
            handler=self.handler,
            concurrency=self.concurrency,
            lease_seconds=self.lease_seconds,
            poll_seconds=self.poll_seconds,
            worker_id=self.worker_id,
            config=self.config,
            heartbeat_pool=heartbeat_pool,
        )
        metrics.watch_runs(lambda: len(dispatcher.in_flight), self.concurrency)
        background += [
            asyncio.create_task(dispatcher.watch_cancels(), name="runrow-cancel-watch"),
            asyncio.create_task(
                reaper_loop(
                    pool,
                    interval=self.reap_interval,
                    grace_seconds=self.grace_seconds,
                    trim_after=self.trim_after,
                ),
                name="runrow-reaper",
            ),
            # Warns when the LISTEN URL goes through a pooler that drops notifications.
            asyncio.create_task(hub.self_test(pool), name="runrow-hub-self-test"),
        ]
        webhooks_stopping = asyncio.Event()
        webhooks: asyncio.Task[None] | None = None
        if self.webhooks is not None:
            webhooks = asyncio.create_task(
                webhook_loop(
                    pool, self.webhooks, worker_id=self.worker_id, hub=hub, stopping=webhooks_stopping
                ),
                name="runrow-webhooks",
            )
            background.append(webhooks)
        await dispatcher.start()
        log.info(
            "worker %s started: concurrency %d, lease %ds, poll %.1fs, drain %.1fs",
            self.worker_id,
            self.concurrency,
            self.lease_seconds,
            self.poll_seconds,
            self.drain_seconds,
        )
        try:
            await self._stop.wait()
            deadline = await self._drain(dispatcher)
            if webhooks is not None and self.webhooks is not None:
                # Deliveries in flight end and are recorded (each within the timeout); the
                # runs the drain ended have their deliveries sent by whichever worker is up.
                # Waited for at most their lease (past it another worker may take them anyway)
                # and within the drain's deadline: one cut short is sent again after its lease.
                webhooks_stopping.set()
                left = min(self.webhooks.lease_seconds, deadline - time.monotonic())
                await asyncio.wait({webhooks}, timeout=max(0.0, left))
        finally:
            if metrics_server is not None:
                metrics_server.close()
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await writer.stop()
            await hub.stop()
            await _close(pool, heartbeat_pool, *([metrics_pool] if metrics_pool is not None else []))
        log.info(
            "worker %s stopped: %d run(s) claimed in %d claim(s), %d journal transaction(s)",
            self.worker_id,
            dispatcher.claimed,
            dispatcher.claims,
            writer.ticks,
        )
        return 0

    async def _connect(self) -> _Pools:
        """The work pool, open on a database with runrow's schema, the heartbeats' pool, the
        scrapes' (None without --metrics-port), and the LISTEN connection's session limits; the
        pools are closed again if anything here fails or is cancelled."""
        # PostgreSQL itself ends this process's sessions within about a lease if it freezes
        # or vanishes inside a transaction, so its row locks cannot stall reapers and stops.
        limits: dict[str, Any] = {}
        hub_limits: dict[str, Any] = {}
        # One wait for the database in all, whoever waits: the probes below, then the pool.
        deadline = time.monotonic() + START_TIMEOUT
        if self.session_limits:
            targets = [(self.conninfo, "worker pool"), (self.listen_conninfo, "worker hub (LISTEN)")]
            limits, hub_limits = await accepted_kwargs_within(
                [(url, worker_connection_kwargs(url, self.lease_seconds), what) for url, what in targets],
                deadline=deadline,
                failed=self._refused,
            )
        kwargs = {"autocommit": True, "application_name": "runrow-worker", **POOLER_SAFE, **limits}
        pool = CancelSafePool(self.conninfo, min_size=1, max_size=self.pool_size, kwargs=kwargs, open=False)
        heartbeat_pool = CancelSafePool(
            self.conninfo,
            min_size=1,
            max_size=heartbeat_pool_size(self.concurrency),
            kwargs=kwargs,
            open=False,
        )
        pools = [pool, heartbeat_pool]
        metrics_pool = None
        if self.metrics_port is not None:
            metrics_pool = CancelSafePool(
                self.conninfo,
                min_size=METRICS_CONNECTIONS,
                max_size=METRICS_CONNECTIONS,
                kwargs={**kwargs, "application_name": "runrow-worker-metrics"},
                open=False,
            )
            pools.append(metrics_pool)
        try:
            for each in pools:
                await each.open(wait=True, timeout=max(1.0, deadline - time.monotonic()))
            async with pool.connection() as conn:
                row = await (await conn.execute("SELECT runrow.schema_version()")).fetchone()
            version = row[0] if row else None
            if (problem := schema.too_old(version, "this worker")) is not None:
                raise SchemaMissing(problem)  # the pools are closed below
        except (psycopg.errors.InvalidSchemaName, psycopg.errors.UndefinedFunction):
            # Started anyway, it logged a failed reap and a failed claim every tick, forever.
            await _close(*pools)
            raise SchemaMissing(
                "the database has no runrow schema: run `runrow migrate` on it first"
            ) from None
        except psycopg.errors.InsufficientPrivilege:
            await _close(*pools)
            raise SchemaMissing(
                "this login may not call runrow's functions: GRANT runrow_worker TO it"
            ) from None
        except PoolTimeout as exc:
            await _close(*pools)
            raise CannotConnect(
                START_TIMEOUT, next((p.last_error for p in pools if p.last_error), None) or self._refusal
            ) from exc
        except BaseException:  # a stop before the database answered
            await _close(*pools)
            raise
        return pool, heartbeat_pool, metrics_pool, hub_limits

    def _refused(self, exc: BaseException) -> None:
        self._refusal = exc

    async def _drain(self, dispatcher: Dispatcher) -> float:
        """Stop claiming, let runs in flight finish within the drain budget, release the rest.
        Returns the deadline (time.monotonic()) the phases after the drain share: the waits
        for released and cancelled runs here, then the webhook deliveries in flight."""
        await dispatcher.stop_claiming()  # phase 1: milliseconds, nothing new is claimed
        tasks = dispatcher.tasks()
        pending: set[asyncio.Task[Any]] = set()
        if tasks:
            log.info("draining %d run(s)", len(tasks))
            _, pending = await asyncio.wait(tasks, timeout=self.drain_seconds)  # phase 2
        grace = stop_grace(self.lease_seconds)
        deadline = time.monotonic() + grace
        if pending:
            await self._release(dispatcher, pending, deadline - grace / 2, deadline)
        return deadline

    async def _release(
        self, dispatcher: Dispatcher, pending: set[asyncio.Task[Any]], halfway: float, deadline: float
    ) -> None:
        """The drain budget is spent: abandon what is left (released, `drained: ...`) until
        `halfway`, then cancel what still runs and await its cleanup until `deadline`. Each
        wait was a lease of its own (60 s past --drain at --lease 30, and the webhooks after)."""
        log.warning("drain budget spent: releasing %d run(s)", len(pending))
        for sup, task in list(dispatcher.in_flight.values()):
            if task in pending:
                sup.abandon(f"drained: worker {self.worker_id} stopped before the run finished")
        _, stuck = await asyncio.wait(pending, timeout=max(0.0, halfway - time.monotonic()))
        if not stuck:
            return
        for task in stuck:
            task.cancel()
        # What a cancelled run does on its way out (the agent pays for a response it cut,
        # records a tool call it interrupted) must land before the writer stops and the pools
        # close: not awaited, it met a closed pool and was lost (the worker audit). Bounded:
        # a task that swallows this cancellation too is left, and the process exits without it.
        _, left = await asyncio.wait(stuck, timeout=max(0.0, deadline - time.monotonic()))
        if left:
            self.unstoppable = len(left)
            log.warning("%d run(s) did not stop when cancelled; the reaper takes them", len(left))


def stop_grace(lease_seconds: float) -> float:
    """Seconds the phases after the drain share (README: Drain): enough for a handler to stop
    and its run to be released or its cleanup to land, and bounded whatever the lease, so the
    worst shutdown is --drain + 10 s (plus milliseconds to flush and close), inside systemd's
    TimeoutStopSec and Kubernetes' terminationGracePeriodSeconds when --drain leaves room."""
    return max(5.0, min(float(lease_seconds), 10.0))


async def _close(*pools: CancelSafePool) -> None:
    for pool in pools:
        await pool.close()
