"""The run supervisor: one per claimed run. Runs the handler with a heartbeat beside it and
writes the ending.

- lost (heartbeat owned = false, or the journal fenced out): cancel the handler at once and
  write nothing more; whoever took the run (reaper, stop, a newer claim) owns the ending.
- cancel (NOTIFY on runrow_cancel, or the heartbeat poll): `ctx.cancel` is set; the handler
  stops and returns Outcome('cancelled'), keeping the partial text already journaled.
- the handler raises: release_run with the error (the attempts policy requeues or fails it),
  unless the failure would recur identically on every attempt (pyworker/worker/failures.py: the
  database refused the run's own data, or DeterministicFailure): then finish_run 'failed'
  once, so no attempt pays the model again for the same refusal.
- drain past its budget (`abandon`): the handler is cancelled and the run released with
  error 'drained' (requeued while attempts are left, else failed).
- otherwise: end the run with its outcome through the journal writer, which sends the
  buffered deltas and the terminal write together (finish_runs, the same fence as finish_run)
  in its next group flush, shared with the process's other runs ('release' → release_run;
  'parked' → nothing, the handler already handed it back).
- an ending fenced out: one heartbeat with the claim's token tells whether the fence was right.
  Not owned: logged with what the run is now ('lost'). Owned, a fault on the database side:
  logged at ERROR, and the run is released at once (a deterministic failure is ended failed
  once more instead), so it is retried or failed now, not reaped at the lease's end.
- a transient database error (restart, failover) is retried on a fresh connection by every
  call made here, the heartbeat and the journal (pyworker/db/retry.py); it never ends or
  releases the run. After about a lease without a database (DatabaseUnavailable) the run is
  given up quietly ('abandoned': nothing more written; a reaper takes it). A finish_run or
  release_run whose first COMMIT went unanswered and whose retry is fenced out is read back
  with get_run: it was this claim's own ending, or someone else's.

The handler and the ending run in the supervisor's own task, not in tasks of their own: a task
is a few dozen Python calls and event-loop callbacks more per run, and a zero-length run is
little else (measured: 4.1 tasks and 17 callbacks per run down to 2.1 and 11). What a task of
their own gave, being cancelled alone when the run is lost or the drain abandons it, the
supervisor does by cancelling its own task while it is in the handler (or in an ending that has
no verdict yet) and withdrawing that cancellation when it lands (`_interrupt`,
`_withdraw_interrupts`). A cancellation from anyone else stands and ends the supervisor as
before, even one the handler swallowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import timedelta
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from pyworker.db import api
from pyworker.db.aio import WatchedEvent
from pyworker.db.api import ClaimedRun
from pyworker.db.claimed_json import unreadable_field
from pyworker.db.retry import DatabaseUnavailable, Retry
from pyworker.worker import metrics, tracing
from pyworker.worker.failures import DeterministicFailure, deterministic
from pyworker.worker.handler import Outcome, RunContext, RunHandler
from pyworker.worker.heartbeat import heartbeat_loop
from pyworker.worker.journal import JournalError, JournalWriter, RunLost
from pyworker.worker.logs import run_logger

FINISH_STATUSES = ("completed", "failed", "cancelled")


class RunSupervisor:
    def __init__(
        self,
        run: ClaimedRun,
        *,
        pool: AsyncConnectionPool,
        writer: JournalWriter,
        handler: RunHandler,
        lease_seconds: int,
        worker_id: str,
        config: dict[str, Any] | None = None,
        heartbeat_pool: AsyncConnectionPool | None = None,
    ) -> None:
        self.run = run
        self.cancel = asyncio.Event()
        # Watched: the supervisor wakes on it beside the handler and the ending without a
        # task waiting on it.
        self.lost = WatchedEvent()
        self.log = run_logger(run, worker_id)
        self._pool = pool
        # A worker gives heartbeats a pool of their own: behind handlers that hold every work
        # connection, a heartbeat waited out its budget and the healthy run was given up.
        self._heartbeat_pool = heartbeat_pool or pool
        self._writer = writer
        self._handler = handler
        self._lease = lease_seconds
        self._beat = asyncio.Event()
        self._abandoned: str | None = None
        self._task: asyncio.Task[Any] | None = None  # the task supervise() runs in
        # Where that task is while it may be interrupted ("handler", "ending"), and how many of
        # its pending cancellations this supervisor asked for (lost, abandoned).
        self._in: str | None = None
        self._interrupts = 0
        self._heartbeat: asyncio.Task[None] | None = None
        self._heartbeat_due: asyncio.TimerHandle | None = None
        self._heartbeat_stopped = False
        self.retry = Retry(lease_seconds, self.log)  # about a lease without a database: give up
        self.journal = writer.run_journal(run, self.lost)
        self.ctx = RunContext(
            run=run,
            pool=pool,
            journal=self.journal,
            cancel=self.cancel,
            lost=self.lost,
            log=self.log,
            worker_id=worker_id,
            config=dict(config or {}),
            retry=self.retry,
        )
        self.ending: str | None = None  # what this supervisor wrote (for logs and tests)
        self.lost.watch(self._interrupt_soon)

    def request_cancel(self) -> None:
        """A hint (NOTIFY on runrow_cancel): beat now; the heartbeat cancels when the row says
        `cancel_requested`. Any login may NOTIFY any channel, so the hint alone stops nothing."""
        self.poke()

    def poke(self) -> None:
        """Beat now (e.g. after a hub reconnect, when a cancel NOTIFY may have been lost)."""
        self._beat.set()
        self._start_heartbeat()

    def abandon(self, reason: str) -> None:
        """Drain budget spent: stop the handler; the run is released with `reason`."""
        self._abandoned = reason
        self._interrupt_soon(ending_too=False)

    async def supervise(self) -> str | None:
        self._task = asyncio.current_task()
        started = time.monotonic()
        with tracing.attempt(self.run, self.ctx.worker_id) as span:
            try:
                return await self._supervise()
            finally:
                tracing.attempt_ended(span, self.ending)
                metrics.attempt_ended(self.ending, time.monotonic() - started)

    async def _supervise(self) -> str | None:
        self.log.info("run claimed (attempt %s of %s)", self.run.attempt, self.run.max_attempts)
        # The first beat is due a third of a lease after the claim: a timer until then, not a
        # task waiting, so a run that ends sooner (most short runs) costs no heartbeat task.
        self._heartbeat_due = asyncio.get_running_loop().call_later(self._lease / 3, self._start_heartbeat)
        try:
            outcome, error = await self._run_handler()
            if self.lost.is_set():
                self.ending = "lost"
                self.log.warning("run lost; this worker writes nothing more for it")
                return self.ending
            # The heartbeat keeps going through an ending that goes through the writer: the
            # handler's last events may still be in flight (emit wait=False), and the ending
            # must learn that the run was lost exactly as the handler would have (see _finish).
            self.ending = await self._end(outcome, error)
            return self.ending
        finally:
            self._stop_heartbeat()
            if self._heartbeat is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._heartbeat
            self.journal.close()  # this claim's journal only: a newer claim of the run keeps its own

    def _start_heartbeat(self) -> None:
        """The heartbeat loop, beating at once (its first beat is due, or was asked for)."""
        if self._heartbeat is not None or self._heartbeat_stopped:
            return
        if self._heartbeat_due is not None:
            self._heartbeat_due.cancel()
        self._beat.set()
        self._heartbeat = asyncio.create_task(
            heartbeat_loop(
                self._heartbeat_pool,
                self.run,
                self._lease,
                cancel=self.cancel,
                lost=self.lost,
                log=self.log,
                beat=self._beat,
                retry=self.retry,
            )
        )

    async def _run_handler(self) -> tuple[Outcome | None, BaseException | None]:
        if self._abandoned is not None or self.lost.is_set():
            return None, None
        outcome: Outcome | None = None
        error: Exception | None = None
        unreadable = unreadable_field(self.run)
        if unreadable is not None:
            # Enqueued before enqueue_run refused such JSON (pyworker/db/claimed_json.py): no
            # attempt can read it, so the run ends once, and the claim it came with goes on.
            name, value = unreadable
            return None, DeterministicFailure(
                f"the run's {name} cannot be read as JSON ({value.error}); enqueue_run now refuses "
                "such values: enqueue the turn again without it"
            )
        self._in = "handler"
        try:
            outcome = await self._handler(self.ctx)
        except asyncio.CancelledError:
            if not self._withdraw_interrupts():
                raise
            return None, None  # lost or abandoned: stopped at once
        except Exception as exc:
            error = exc
        finally:
            self._in = None
        if not self._withdraw_interrupts():
            raise asyncio.CancelledError  # someone else's cancellation, which the handler swallowed
        return outcome, error

    def _interrupt_soon(self, ending_too: bool = True) -> None:
        """Stop the handler (lost, abandoned), or an ending still without a verdict (lost only:
        `ending_too`), at once. Asked from a callback of its own: the lost event is often set by
        code running in this very task (a journal flush it leads), and a task that cancels itself
        is cancelled at its next await, wherever that is; from outside, the cancellation lands
        where the task waits, which is inside the handler or the ending whenever `_in` says so."""
        asyncio.get_running_loop().call_soon(self._interrupt, ending_too)

    def _interrupt(self, ending_too: bool) -> None:
        task = self._task
        if task is None or task.done():
            return
        ending = ending_too and self._in == "ending" and not self.journal.ending_settled
        if self._in == "handler" or ending:
            self._interrupts += 1
            task.cancel()

    def _withdraw_interrupts(self) -> bool:
        """Take back this supervisor's own cancellations of its task, delivered or not; True
        when none is left, False when someone else's stands (it is raised on)."""
        task = self._task
        if task is None:
            return False
        while self._interrupts:
            self._interrupts -= 1
            task.uncancel()
        return task.cancelling() == 0

    async def _end(self, outcome: Outcome | None, error: BaseException | None) -> str | None:
        if self._abandoned is not None and outcome is None:
            return await self._release(self._abandoned)
        if error is not None:
            if isinstance(error, RunLost):
                return "lost"
            if isinstance(error, DatabaseUnavailable):
                return self._give_up(error)
            reason = deterministic(error)
            if reason is not None:
                self.log.error("handler failed deterministically; the run fails: %s", reason, exc_info=error)
                return await self._fail(reason)
            self.log.error("handler raised; releasing the run", exc_info=error)
            return await self._release(f"{type(error).__name__}: {error}")
        if outcome is None:  # cancelled from outside without a drain: hand it back
            return await self._release("handler cancelled")
        if outcome.status in ("parked", "ended"):
            self._stop_heartbeat()  # handed back or ended in SQL: the next beat would say "not ours"
        if outcome.status == "parked":
            self.log.info("run parked by its handler")
            await self._flush_quietly()
            return "parked"
        if outcome.status == "ended":
            self.log.info("run ended by the database (%s)", outcome.error or "budget_exhausted")
            return "ended"
        if outcome.status == "release":
            return await self._release(outcome.error, outcome.retry_in)
        if outcome.status == "defer" and outcome.retry_in is not None:
            return await self._release(outcome.error, outcome.retry_in, defer=True)
        if outcome.status not in FINISH_STATUSES:
            return await self._release(f"handler returned an unknown status {outcome.status!r}")
        try:
            # The buffered deltas ride with the ending (finish_runs journals them first).
            ok = await self._finish(outcome.status, outcome.result, outcome.error)
        except RunLost:
            self.log.warning("run lost while ending it; writing nothing more")
            return "lost"
        except DatabaseUnavailable as exc:
            return self._give_up(exc)
        except (psycopg.Error, JournalError) as exc:
            reason = deterministic(exc)
            if reason is None:
                raise
            # e.g. a result over finish_run's size limit: every attempt would end here again.
            self.log.error("finish_run refused the outcome; the run fails: %s", reason)
            return await self._fail(f"the run's {outcome.status} outcome could not be stored: {reason}")
        if not ok:
            if await self._fenced_out("finish_run", then="releasing it"):
                return await self._release("finish_run was fenced out while this claim held the run")
            return "lost"
        self.log.info("run finished: %s", outcome.status)
        return outcome.status

    async def _fail(self, reason: str) -> str | None:
        # The journal may be the thing that refused (its flush then raises again): keep what
        # it can still write, then end the run; finish_run journals the complete itself.
        stop = await self._flush_quietly()
        if stop is not None:
            return stop
        # A wrong fence (the claim still holds the run: _fenced_out) is answered by ending the
        # run failed once more, not by a release: a deterministic failure is not tried again.
        for last in (False, True):
            try:
                ok = await self._finish("failed", None, reason)
            except RunLost:
                self.log.warning("run lost while ending it; writing nothing more")
                return "lost"
            except DatabaseUnavailable as exc:
                return self._give_up(exc)
            if ok:
                self.log.info("run finished: failed (%s)", reason)
                return "failed"
            then = "the reaper takes it at the lease's end" if last else "ending it failed again"
            held = await self._fenced_out("finish_run", then=then)
            if last or not held:
                break
        return "lost"

    async def _finish(self, status: str, result: Any, error: str | None) -> bool:
        """The ending, sent with this process's other runs' endings and journals in the writer's
        next group flush, through transient errors; False: someone else ended the run.

        Watched like the handler: the ending may be waiting behind a flush of the handler's
        last events (emit wait=False) that is stuck on a cut connection, and the heartbeat is
        then what learns the run was lost (owned = false, or no database for a lease).
        RunLost: stopped waiting; the writer skips a lost run's ending, so nothing more is
        written for it."""
        if self.lost.is_set():
            raise RunLost(str(self.run.run_id))
        self._in = "ending"
        try:
            ok, maybe_landed = await self._writer.finish(self.journal, status, result, error)
        except asyncio.CancelledError:
            if not self._withdraw_interrupts():
                raise
            raise RunLost(str(self.run.run_id)) from None
        finally:
            self._in = None
        if not self._withdraw_interrupts():
            raise asyncio.CancelledError
        self._stop_heartbeat()
        if not ok and maybe_landed:
            ok = await self._ended_by_us(status, error) is not None
        return ok

    def _stop_heartbeat(self) -> None:
        self._heartbeat_stopped = True
        if self._heartbeat_due is not None:
            self._heartbeat_due.cancel()
        if self._heartbeat is not None:
            self._heartbeat.cancel()

    async def _release(
        self, reason: str | None, retry_in: float | None = None, *, defer: bool = False
    ) -> str | None:
        """release_run, or defer_run when `defer` (a fleet limit's wait: no attempt spent)."""
        self._stop_heartbeat()  # once released, the next beat would say the run is not ours
        stop = await self._flush_quietly()
        if stop is not None:
            return stop
        run = self.run
        calls = 0
        backoff = None if retry_in is None else timedelta(seconds=min(max(retry_in, 0.001), 86400))

        call = "defer_run" if defer else "release_run"

        async def release(conn: Any) -> str | None:
            nonlocal calls
            calls += 1
            if defer:
                assert backoff is not None
                return await api.defer_run(conn, run.run_id, run.claim_token, backoff, reason or "deferred")
            return await api.release_run(conn, run.run_id, run.claim_token, reason, retry_in=backoff)

        try:
            result = await self.retry.call(self._pool, release, call)
            if result is None and calls > 1:
                # The first try's COMMIT landed unanswered: say what it did, as its answer would
                # have (a run it left queued was requeued, or deferred), never a value of our own.
                result = await self._ended_by_us(None, reason, given_back=defer)
        except DatabaseUnavailable as exc:
            return self._give_up(exc)
        if result is None:
            await self._fenced_out(call, then="the reaper takes it at the lease's end")
            return "lost"
        self.log.info(
            "run %s (%s): %s",
            "deferred" if defer else "released",
            reason,
            _what_next(result, None if backoff is None else backoff.total_seconds()),
        )
        # Waiting for a fleet limit is not the run failing: an ending of its own, not a
        # released:* (which traces as an error). A stop that was pending still wins: cancelled.
        return "deferred" if result == "deferred" else f"released:{result}"

    async def _fenced_out(self, call: str, *, then: str) -> bool:
        """An ending the database fenced out: True if this claim still holds the run. The probe
        is a heartbeat with the claim's token (it writes only the lease). Not owned: someone
        took the run; logged with what the run is now. Owned: the fence was wrong, a fault on
        the database side (stop 38 found one: finish_and_claim_runs' recheck of a row a
        heartbeat had just updated lost the ending); logged at ERROR with what the caller does
        `then`, so the run is not left running until the reaper takes it at the lease's end.
        A probe and a read, on a rare path."""
        metrics.fenced(call)
        run = self.run
        try:
            probe = await self.retry.call(
                self._pool,
                lambda conn: api.heartbeat(conn, run.run_id, run.claim_token, self._lease),
                "heartbeat",
            )
            if probe.owned:
                self.log.error("%s fenced out, yet this claim still holds the run; %s", call, then)
                return True
            row = await self.retry.call(self._pool, lambda conn: api.get_run(conn, run.run_id), "get_run")
        except (DatabaseUnavailable, psycopg.Error) as exc:
            self.log.warning("%s fenced out: someone else ended or took the run (not read: %s)", call, exc)
            return False
        error = f" ({row.error})" if row.error else ""
        self.log.warning("%s fenced out: the run is %s on attempt %s%s", call, row.status, row.attempt, error)
        return False

    async def _ended_by_us(
        self, status: str | None, error: str | None, *, given_back: bool = False
    ) -> str | None:
        """A retried ending was fenced out: had the first try's unanswered COMMIT landed? What
        its answer would have been (the run's status; a release's or deferral's requeued or
        deferred for a run it left queued), or None when it had not. Only this claim ends its
        attempt with its own error text (a reaper or a stop writes theirs). given_back: the
        ending was a deferral, stored as api.deferral_error says, which gives the attempt back to
        a run it requeues (a stop pending wins: cancelled, the attempt kept), unless it was a
        deferral for 429s past the run's cap, which defer_run releases instead: the attempt
        spent, the error the reason with the database's suffix (api.released_past_429_cap)."""
        row = await self.retry.call(self._pool, lambda conn: api.get_run(conn, self.run.run_id), "get_run")
        landed = str(row.status)
        sent = api.deferral_error(error) if given_back else api.stored_error(error)
        if (
            row.attempt == self.run.attempt - (1 if given_back and landed == "queued" else 0)
            and row.error == sent
            and (status is None or landed == status)
        ):
            if status is None and landed == "queued":
                landed = "deferred" if given_back else "requeued"
        elif not (
            given_back and row.attempt == self.run.attempt and api.released_past_429_cap(error, row.error)
        ):
            return None
        elif landed == "queued":
            landed = "requeued"
        self.log.warning("the ending's first COMMIT had landed: the run is %s", row.status)
        return landed

    def _give_up(self, exc: DatabaseUnavailable) -> str:
        self.log.warning("giving the run up, writing nothing more (a reaper takes it): %s", exc)
        return "abandoned"

    async def _flush_quietly(self) -> str | None:
        """Flush before a hand-back; the ending to stop at ('lost', 'abandoned') when nothing
        more may be written, else None."""
        try:
            await self.journal.flush()
        except RunLost:
            return "lost"
        except DatabaseUnavailable as exc:
            return self._give_up(exc)
        except Exception as exc:
            self.log.warning("journal flush before hand-back failed: %s", exc)
        return None


def _what_next(result: str, retry_in: float | None) -> str:
    """A release's or deferral's result as the log says it. It said "retry in None" for a run
    released without a backoff (claimable at once), and for one that failed, never retried."""
    if result == "requeued":
        return "requeued, claimable at once" if retry_in is None else f"requeued, claimable in {retry_in:g} s"
    if result == "deferred" and retry_in is not None:
        return f"deferred, claimable within {retry_in:g} s"  # sooner if the key's block ends sooner
    return result
