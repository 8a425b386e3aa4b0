"""A transient database error never costs a run anything (issue 17): each worker write is made
again on a fresh connection, a write whose COMMIT went unanswered is read back rather than made
twice, the fence decides who owns the run, and after the retry budget (about a lease) without a
database the run is given up quietly. Deterministic errors are raised at once.

The faults are real lost connections at exact points of the wire protocol (a proxy between the
worker's pool and PostgreSQL: tests/wire_fault_support.py), or a database that is not there.
tests/test_db_restart.py does the same with real server restarts under load.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from wire_fault_support import faulty_pool, proxy
from worker_support import (
    db,
    enqueue_echo,
    events,
    in_process_dispatcher,
    pool,
    run_row,
    wait_until_async,
    worker_db,
    worker_db_superuser,
)

from pyworker.agent import loop as agent_loop
from pyworker.agent.model import ModelTurn
from pyworker.db import api
from pyworker.db import limits as limits_api
from pyworker.db.api import ClaimedRun
from pyworker.db.cancel_safe_pool import CancelSafePool
from pyworker.db.retry import DatabaseUnavailable, Retry, is_transient, outcome_unknown
from pyworker.worker.dispatcher import Dispatcher
from pyworker.worker.echo import handle as echo
from pyworker.worker.failures import deterministic
from pyworker.worker.handler import Outcome, RunContext
from pyworker.worker.heartbeat import heartbeat_loop
from pyworker.worker.journal import JournalWriter
from pyworker.worker.logs import run_logger
from pyworker.worker.supervisor import RunSupervisor

__all__ = ["db", "faulty_pool", "pool", "proxy", "worker_db", "worker_db_superuser"]

CLOCK_OFF = 3600.0  # the journal clock never ticks: only write-through flushes write
LOG = logging.getLogger("runrow.test")


@pytest.fixture
async def no_database(tmp_path) -> AsyncIterator[AsyncConnectionPool]:  # type: ignore[no-untyped-def]
    """A pool whose server is not there at all (a socket folder nothing listens in)."""
    p = CancelSafePool(f"host={tmp_path} dbname=none", min_size=1, kwargs={"autocommit": True}, open=False)
    await p.open(wait=False)
    yield p
    await p.close()


async def claim(pool: AsyncConnectionPool, lease: int = 60, **enqueue: Any) -> ClaimedRun:
    async with pool.connection() as conn:
        await api.enqueue_run(conn, uuid.uuid4(), "hi", "echo", **enqueue)
        run = await api.claim_run(conn, "retry-test", lease)
    assert run is not None
    return run


def context(run: ClaimedRun, pool: AsyncConnectionPool, writer: JournalWriter) -> RunContext:
    lost = asyncio.Event()
    log = run_logger(run, "retry-test")
    return RunContext(
        run=run,
        pool=pool,
        journal=writer.run_journal(run, lost),
        cancel=asyncio.Event(),
        lost=lost,
        log=log,
        worker_id="retry-test",
        retry=Retry(30, log),
    )


def kinds(db, run_id: uuid.UUID) -> list[str]:  # type: ignore[no-untyped-def]
    rows = events(db, run_id)
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))  # gap-free
    return [r["type"] for r in rows]


# --- what counts as transient ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "transient", "unknown"),
    [
        (psycopg.OperationalError("server closed the connection unexpectedly"), True, True),
        (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), True, True),
        (psycopg.errors.CrashShutdown("terminating connection because of crash"), True, True),
        (psycopg.errors.CannotConnectNow("the database system is starting up"), True, True),
        (psycopg.errors.ConnectionFailure("connection failure"), True, True),
        (psycopg.errors.SerializationFailure("could not serialize access"), True, False),
        (psycopg.errors.DeadlockDetected("deadlock detected"), True, False),
        (psycopg.errors.ReadOnlySqlTransaction("cannot execute in a read-only transaction"), True, False),
        (psycopg.errors.DiskFull("could not extend file: No space left on device"), True, False),
        (psycopg.errors.OutOfMemory("out of memory"), True, False),
        (psycopg.errors.InvalidParameterValue("lease_seconds must be"), False, False),
        (psycopg.errors.NullValueNotAllowed("run_id must not be NULL"), False, False),
        (psycopg.errors.UniqueViolation("duplicate key"), False, False),
        (psycopg.errors.UndefinedFunction("function does not exist"), False, False),
        (psycopg.errors.ObjectNotInPrerequisiteState("wrong state"), False, False),
        (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), False, False),
        (ValueError("not a database error"), False, True),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_transient_means_the_server_could_not_answer_not_that_it_refused(
    error: Exception, transient: bool, unknown: bool
) -> None:
    assert is_transient(error) is transient
    assert outcome_unknown(error) is unknown
    if transient:  # never also a failure that ends the run at once (pyworker/worker/failures.py)
        assert deterministic(error) is None


async def test_a_deterministic_error_is_raised_at_once_and_not_retried(pool, db) -> None:
    run = await claim(pool)
    calls = 0

    async def bad_lease(conn: psycopg.AsyncConnection[Any]) -> object:
        nonlocal calls
        calls += 1
        return await api.heartbeat(conn, run.run_id, run.claim_token, 0)

    with pytest.raises(psycopg.errors.InvalidParameterValue, match="lease_seconds"):
        await Retry(30, LOG).call(pool, bad_lease, "heartbeat")
    assert calls == 1


async def test_without_a_database_for_the_budget_the_call_gives_up(no_database) -> None:
    with pytest.raises(DatabaseUnavailable, match="no database for"):
        await Retry(0.5, LOG).call(no_database, lambda conn: conn.execute("SELECT 1"), "a read")


# --- the journal: a write-through flush ------------------------------------------------------


@pytest.mark.parametrize(
    ("needle", "deliver"),
    [(b"append_events", False), (b"COMMIT", False), (b"COMMIT", True)],
    ids=["lost-before-commit", "commit-not-delivered", "commit-delivered-answer-lost"],
)
async def test_a_write_through_event_rides_out_a_lost_connection(
    faulty_pool, proxy, db, needle: bytes, deliver: bool
) -> None:
    run = await claim(faulty_pool)
    writer = JournalWriter(faulty_pool, interval=CLOCK_OFF)
    journal = writer.run_journal(run)
    await journal.emit({"type": "text_delta", "index": 0, "text": "Hello"})  # buffered
    proxy.break_at(needle, deliver=deliver)
    await journal.emit({"type": "tool_use", "id": "tu_1"})  # writes through: returns once committed
    assert proxy.fired == [f"{needle.decode()} {'delivered' if deliver else 'dropped'}"]
    assert kinds(db, run.run_id)[-2:] == ["text_delta", "tool_use"]
    assert kinds(db, run.run_id).count("tool_use") == 1
    assert not journal.lost.is_set()
    await writer.stop()


async def test_a_write_through_event_waits_out_a_full_disk(pool, db, worker_db_superuser) -> None:
    """The server's disk fills (SQLSTATE 53100, raised here by a trigger on the journal while a
    flag row exists): the write is made again in place until there is room, and the run keeps
    its attempt. It was taken for a refusal: the run was handed back and claimed again, and an
    agent paid the model again, attempt after attempt, until it died of a full disk."""
    run = await claim(pool)
    with psycopg.connect(worker_db_superuser, autocommit=True) as admin:
        admin.execute("CREATE TABLE public.disk_is_full ()")
        admin.execute("INSERT INTO public.disk_is_full DEFAULT VALUES")
        admin.execute(
            """
            CREATE FUNCTION public.no_space() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
            BEGIN
                IF EXISTS (SELECT FROM public.disk_is_full) THEN
                    RAISE EXCEPTION 'could not extend file: No space left on device'
                        USING ERRCODE = 'disk_full';
                END IF;
                RETURN NEW;
            END $$
            """
        )
        admin.execute(
            "CREATE TRIGGER no_space BEFORE INSERT ON runrow.run_event"
            " FOR EACH ROW EXECUTE FUNCTION public.no_space()"
        )
        writer = JournalWriter(pool, interval=CLOCK_OFF, retry_budget=30)
        journal = writer.run_journal(run)
        emitted = asyncio.ensure_future(journal.emit({"type": "tool_use", "id": "tu_1"}))  # writes through
        await asyncio.sleep(1.0)
        assert not emitted.done(), emitted
        admin.execute("DELETE FROM public.disk_is_full")  # an operator freed space
        await asyncio.wait_for(emitted, 10)
    assert kinds(db, run.run_id)[-1] == "tool_use"
    assert not journal.lost.is_set()
    await writer.stop()


async def test_a_write_through_flush_gives_up_after_its_budget(no_database, pool) -> None:
    run = await claim(pool)
    writer = JournalWriter(no_database, interval=CLOCK_OFF, retry_budget=0.5)
    journal = writer.run_journal(run)
    with pytest.raises(DatabaseUnavailable):
        await journal.emit({"type": "tool_use", "id": "tu_1"})
    await writer.stop()


# --- the model_turn commit: append_step + its event, never twice ----------------------------


def model_turn(text: str) -> ModelTurn:
    content = [{"type": "text", "text": text}]
    message = {"id": "msg_1", "role": "assistant", "content": content, "model": "claude-fake-1"}
    return ModelTurn(
        message=message,
        content_text=json.dumps(content),
        stop_reason="end_turn",
        usage={"input_tokens": 3, "output_tokens": 1},
        request_id="req_1",
    )


@pytest.mark.parametrize(
    ("needle", "deliver"),
    [(b"append_step", False), (b"COMMIT", False), (b"COMMIT", True)],
    ids=["lost-before-commit", "commit-not-delivered", "commit-delivered-answer-lost"],
)
async def test_a_model_turn_is_committed_once_through_a_lost_connection(
    faulty_pool, proxy, db, needle: bytes, deliver: bool
) -> None:
    run = await claim(faulty_pool)
    writer = JournalWriter(faulty_pool, interval=CLOCK_OFF)
    ctx = context(run, faulty_pool, writer)
    proxy.break_at(needle, deliver=deliver)
    seq = await agent_loop._commit_turn(ctx, model_turn("Hi."))
    assert proxy.fired == [f"{needle.decode()} {'delivered' if deliver else 'dropped'}"]
    assert seq == 1
    steps = db.execute(
        "SELECT seq, kind, payload::text FROM runrow.agent_step WHERE run_id = %s", (run.run_id,)
    ).fetchall()
    assert steps == [(1, "model_turn", '[{"type": "text", "text": "Hi."}]')]
    turns = [e for e in events(db, run.run_id) if e["type"] == "model_turn"]
    assert [e["step_seq"] for e in turns] == [1]
    await writer.stop()


async def test_a_model_turn_commit_of_a_run_lost_meanwhile_stands_down(faulty_pool, proxy, db) -> None:
    run = await claim(faulty_pool, max_attempts=2)
    writer = JournalWriter(faulty_pool, interval=CLOCK_OFF)
    ctx = context(run, faulty_pool, writer)
    # The first try dies before it commits; by the retry someone else has the run: the fence says no.
    assert db.execute(
        "SELECT runrow.release_run(run_id => %s, claim_token => %s, error => 'taken')",
        (run.run_id, run.claim_token),
    ).fetchone() == ("requeued",)
    proxy.break_at(b"append_step", deliver=False)
    with pytest.raises(agent_loop.RunLost):
        await agent_loop._commit_turn(ctx, model_turn("Hi."))
    assert db.execute(
        "SELECT count(*) FROM runrow.agent_step WHERE run_id = %s", (run.run_id,)
    ).fetchone() == (0,)
    await writer.stop()


# --- the heartbeat ---------------------------------------------------------------------------


async def test_a_heartbeat_that_lost_its_connection_is_made_again_at_once(faulty_pool, proxy, db) -> None:
    run = await claim(faulty_pool, lease=300)  # the next regular beat is 100 s away
    before = run_row(db, run.run_id)["claim_expires_at"]
    beat, lost = asyncio.Event(), asyncio.Event()
    proxy.break_at(b"heartbeat", deliver=False)
    beat.set()
    task = asyncio.create_task(
        heartbeat_loop(
            faulty_pool, run, 300, cancel=asyncio.Event(), lost=lost, log=run_logger(run), beat=beat
        )
    )
    try:
        await wait_until_async(
            lambda: run_row(db, run.run_id)["claim_expires_at"] > before, within=20, what="the lease extended"
        )
        assert proxy.fired == ["heartbeat dropped"] and not lost.is_set()
    finally:
        task.cancel()


async def test_a_heartbeat_without_a_database_for_a_lease_gives_the_run_up(no_database, pool) -> None:
    run = await claim(pool)
    beat, lost = asyncio.Event(), asyncio.Event()
    beat.set()
    await asyncio.wait_for(
        heartbeat_loop(
            no_database,
            run,
            60,
            cancel=asyncio.Event(),
            lost=lost,
            log=run_logger(run),
            beat=beat,
            retry=Retry(0.5, LOG),
        ),
        timeout=30,
    )
    assert lost.is_set()


# --- the ending: finish_run and release_run whose answer was lost ---------------------------


async def supervise(run: ClaimedRun, pool: AsyncConnectionPool, outcome: Outcome) -> str | None:
    writer = JournalWriter(pool, interval=CLOCK_OFF)

    async def handler(ctx: RunContext) -> Outcome:
        await ctx.journal.emit({"type": "message_start"})
        return outcome

    sup = RunSupervisor(
        run, pool=pool, writer=writer, handler=handler, lease_seconds=60, worker_id="retry-test"
    )
    try:
        return await sup.supervise()
    finally:
        await writer.stop()


@pytest.mark.parametrize("deliver", [True, False], ids=["committed-answer-lost", "not-delivered"])
async def test_a_finish_whose_answer_was_lost_ends_the_run_once(
    faulty_pool, proxy, db, deliver: bool
) -> None:
    run = await claim(faulty_pool)
    proxy.break_at(b"finish_run", deliver=deliver)
    ending = await supervise(run, faulty_pool, Outcome("completed", result={"text": "done"}))
    assert proxy.fired == [f"finish_run {'delivered' if deliver else 'dropped'}"]
    assert ending == "completed"
    row = run_row(db, run.run_id)
    assert (row["status"], row["attempt"], row["result"]) == ("completed", 1, {"text": "done"})
    assert kinds(db, run.run_id).count("complete") == 1


@pytest.mark.parametrize("deliver", [True, False], ids=["committed-answer-lost", "not-delivered"])
async def test_a_release_whose_answer_was_lost_hands_the_run_back_once(
    faulty_pool, proxy, db, deliver: bool
) -> None:
    run = await claim(faulty_pool, max_attempts=3)
    proxy.break_at(b"release_run", deliver=deliver)
    ending = await supervise(run, faulty_pool, Outcome("release", error="model overloaded"))
    assert proxy.fired == [f"release_run {'delivered' if deliver else 'dropped'}"]
    # What release_run did, whether its answer came or not (it read `released:released`, a
    # value release_run never returns, when the first COMMIT had landed unanswered).
    assert ending == "released:requeued"
    row = run_row(db, run.run_id)
    assert (row["status"], row["attempt"], row["error"]) == ("queued", 1, "model overloaded")
    assert kinds(db, run.run_id).count("run_requeued") == 1


@pytest.mark.parametrize("deliver", [True, False], ids=["committed-answer-lost", "not-delivered"])
@pytest.mark.parametrize(("reason", "stored"), [("rate limited", "rate limited"), (None, "deferred")])
async def test_a_deferral_whose_answer_was_lost_is_deferred_once(
    faulty_pool, proxy, db, deliver: bool, reason: str | None, stored: str
) -> None:
    """A fleet limit's wait: the ending is `deferred` (not `released:deferred`, which traced
    as an error), also when the first COMMIT landed and its answer was lost. defer_run stores
    a deferral without a reason as "deferred": the check whether the first try landed compared
    the stored error with None, took the deferral for someone else's ending, logged "fenced
    out" and ended "lost"."""
    run = await claim(faulty_pool, max_attempts=1)
    proxy.break_at(b"defer_run", deliver=deliver)
    ending = await supervise(run, faulty_pool, Outcome("defer", error=reason, retry_in=30))
    assert proxy.fired == [f"defer_run {'delivered' if deliver else 'dropped'}"]
    assert ending == "deferred"
    row = run_row(db, run.run_id)
    assert (row["status"], row["attempt"], row["error"]) == ("queued", 0, stored)
    assert kinds(db, run.run_id).count("run_requeued") == 1


@pytest.mark.parametrize("deliver", [True, False], ids=["committed-answer-lost", "not-delivered"])
async def test_a_deferral_a_stop_won_whose_answer_was_lost_is_cancelled_once(
    faulty_pool, proxy, db, deliver: bool
) -> None:
    """A stop requested before the deferral wins: defer_run ends the run cancelled and gives the
    attempt back only to a run it requeues. The check whether the first try landed expected the
    attempt given back, took the cancellation for someone else's ending, logged "fenced out" and
    ended "lost"; the answer it would have had is `cancelled`."""
    run = await claim(faulty_pool, max_attempts=2)

    async def handler(ctx: RunContext) -> Outcome:
        with psycopg.connect(proxy.target_url, autocommit=True) as other:
            other.execute("SELECT runrow.cancel_run(run_id => %s)", (run.run_id,))
        proxy.break_at(b"defer_run", deliver=deliver)
        return Outcome("defer", error="rate limited", retry_in=30)

    writer = JournalWriter(faulty_pool, interval=CLOCK_OFF)
    sup = RunSupervisor(
        run, pool=faulty_pool, writer=writer, handler=handler, lease_seconds=60, worker_id="t"
    )
    try:
        assert await sup.supervise() == "released:cancelled"
    finally:
        await writer.stop()
    assert proxy.fired == [f"defer_run {'delivered' if deliver else 'dropped'}"]
    row = run_row(db, run.run_id)
    assert (row["status"], row["attempt"], row["error"]) == ("cancelled", 1, "rate limited")
    assert kinds(db, run.run_id).count("complete") == 1


CAP_REASON = "429_cap: rate limited 4 times in one attempt"


async def claim_when_due(pool: AsyncConnectionPool, within: float = 20) -> ClaimedRun:
    """The next claimable run, once one is due (a deferral of 1 ms makes its run due at once)."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        async with pool.connection() as conn:
            run = await api.claim_run(conn, "retry-test", 60)
        if run is not None:
            return run
        assert asyncio.get_running_loop().time() < deadline, "no run came due"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("deliver", [True, False], ids=["committed-answer-lost", "not-delivered"])
@pytest.mark.parametrize(("max_attempts", "ending"), [(1, "released:failed"), (3, "released:requeued")])
async def test_a_deferral_past_the_429_cap_whose_answer_was_lost_is_recognised(
    faulty_pool, proxy, db, deliver: bool, max_attempts: int, ending: str
) -> None:
    """defer_run releases a run's 4th deferral for 429s instead (its attempt spent, the reason
    stored with "(after 3 deferrals for 429s, ...)" after it). When that COMMIT landed and its
    answer was lost, the retry is fenced out and the check whether the first try landed took
    the suffixed error, and the attempt not given back, for someone else's ending: it logged
    "fenced out" and ended "lost" (the run's state was right)."""
    async with faulty_pool.connection() as conn:
        await api.enqueue_run(conn, uuid.uuid4(), "hi", "echo", max_attempts=max_attempts)
        for _ in range(3):  # the run's three deferrals for 429s, the most defer_run gives
            run = await claim_when_due(faulty_pool)
            assert (
                await api.defer_run(conn, run.run_id, run.claim_token, timedelta(milliseconds=1), CAP_REASON)
                == "deferred"
            )
    run = await claim_when_due(faulty_pool)
    proxy.break_at(b"defer_run", deliver=deliver)
    got = await supervise(run, faulty_pool, Outcome("defer", error=CAP_REASON, retry_in=30))
    assert proxy.fired == [f"defer_run {'delivered' if deliver else 'dropped'}"]
    assert got == ending
    row = run_row(db, run.run_id)
    assert (row["status"], row["attempt"]) == (
        ending.removeprefix("released:").replace("requeued", "queued"),
        1,
    )
    assert row["error"].startswith(CAP_REASON + " (after 3 deferrals for 429s"), row["error"]
    assert kinds(db, run.run_id).count("run_requeued") == (4 if max_attempts > 1 else 3)


BLOCKED_REASON = "blocked: waiting 60.0s for a model call"


@pytest.mark.parametrize("deliver", [True, False], ids=["committed-answer-lost", "not-delivered"])
async def test_a_deferral_past_the_bound_on_unanswered_429s_whose_answer_was_lost_is_recognised(
    faulty_pool, proxy, db, deliver: bool
) -> None:
    """defer_run releases a run instead of deferring it once it has reported 24 429s without an
    answer (migration 0109), whatever the reason ("blocked: ..." here: the retry-after of each
    was longer than the worker waits in place). As past the cap above, a retry fenced out
    after the first COMMIT landed must read that ending as its own, not as someone else's."""
    async with faulty_pool.connection() as conn:
        await api.enqueue_run(conn, uuid.uuid4(), "hi", "echo", max_attempts=1)
        for _ in range(23):  # one 429 and a deferral a claim: each deferred
            run = await claim_when_due(faulty_pool)
            await limits_api.report_rate_limited(conn, run.run_id, run.claim_token, 0.001)
            assert (
                await api.defer_run(
                    conn, run.run_id, run.claim_token, timedelta(milliseconds=1), BLOCKED_REASON
                )
                == "deferred"
            )
        run = await claim_when_due(faulty_pool)
        await limits_api.report_rate_limited(conn, run.run_id, run.claim_token, 0.001)
    proxy.break_at(b"defer_run", deliver=deliver)
    got = await supervise(run, faulty_pool, Outcome("defer", error=BLOCKED_REASON, retry_in=30))
    assert proxy.fired == [f"defer_run {'delivered' if deliver else 'dropped'}"]
    assert got == "released:failed"
    row = run_row(db, run.run_id)
    assert (row["status"], row["attempt"]) == ("failed", 1)
    assert row["error"].startswith(BLOCKED_REASON + " (after 24 429s without an answer"), row["error"]


async def test_a_finish_fenced_out_after_a_lost_answer_is_not_mistaken_for_ours(
    faulty_pool, proxy, db
) -> None:
    """The first finish never reached the server, and by the retry a stop has ended the run: the
    run's ending is the stop's, and this worker says it lost the run."""
    run = await claim(faulty_pool, max_attempts=2)
    writer = JournalWriter(faulty_pool, interval=CLOCK_OFF)

    async def handler(ctx: RunContext) -> Outcome:
        with psycopg.connect(proxy.target_url, autocommit=True) as other:
            other.execute(
                "SELECT runrow.release_run(run_id => %s, claim_token => %s, error => 'someone else')",
                (run.run_id, run.claim_token),
            )
        proxy.break_at(b"finish_run", deliver=False)
        return Outcome("completed", result={"text": "done"})

    sup = RunSupervisor(
        run, pool=faulty_pool, writer=writer, handler=handler, lease_seconds=60, worker_id="t"
    )
    assert await sup.supervise() == "lost"
    assert run_row(db, run.run_id)["error"] == "someone else"
    await writer.stop()


# --- the claim: a COMMIT unanswered must not orphan the runs it claimed ---------------------
def _dispatcher(pool, writer, worker_id: str, *, concurrency: int, lease_seconds: int) -> Dispatcher:
    """A dispatcher of echo runs claiming through `pool` (the proxied one, for these tests)."""
    return in_process_dispatcher(
        pool, writer, echo, worker_id, concurrency=concurrency, lease_seconds=lease_seconds
    )


async def test_a_claim_is_two_round_trips_with_the_commit_sent_after_its_rows(
    faulty_pool, pool, proxy, db
) -> None:
    """BEGIN rides with claim_runs (a round trip less per claim than BEGIN, claim, COMMIT); the
    COMMIT goes alone once the rows are in hand, which is what lets an unanswered one be read back
    (the next test)."""
    run_id = enqueue_echo(db, "claimed", duration=0, max_attempts=1)
    d = _dispatcher(faulty_pool, JournalWriter(pool), "trips-test", concurrency=2, lease_seconds=60)
    async with faulty_pool.connection():
        pass  # the pool's connection is made before counting
    proxy.sent.clear()
    (run,) = await d._claim(2)
    # A simple Query or an extended protocol Sync each ends with ReadyForQuery: one round trip.
    trips = [m for m in proxy.sent if m[:1] in (b"Q", b"S")]
    assert len(trips) == 2, proxy.sent
    assert b"claim_runs" in trips[0] and b"COMMIT" not in trips[0]
    assert trips[1][:1] == b"Q" and b"COMMIT" in trips[1]
    row = run_row(db, run_id)
    assert (run.run_id, row["status"], row["worker_id"]) == (run_id, "running", "trips-test")
    owned = db.execute("SELECT owned FROM runrow.heartbeat(%s, %s, 60)", (run_id, run.claim_token))
    assert owned.fetchone() == (True,)  # committed, and the claim token in hand is the live one


async def test_a_claim_refused_is_rolled_back_and_its_connection_reused(
    faulty_pool, proxy, db, caplog
) -> None:
    run_id = enqueue_echo(db, "claimed", duration=0, max_attempts=1)
    d = _dispatcher(
        faulty_pool, JournalWriter(faulty_pool), "refused-test", concurrency=1, lease_seconds=0
    )  # claim_runs refuses a lease under a second
    with pytest.raises(psycopg.Error) as refused:
        await d._claim(1)
    assert refused.value.sqlstate == "22023" and "lease_seconds" in str(refused.value)
    assert run_row(db, run_id)["status"] == "queued"
    async with faulty_pool.connection() as conn:
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert "rolling back returned connection" not in caplog.text


@pytest.mark.parametrize(
    "needle", [b"claim_runs", b"COMMIT"], ids=["claim-answer-lost", "claim-commit-answer-lost"]
)
async def test_runs_of_a_claim_whose_answer_was_lost_are_not_orphaned(
    faulty_pool, pool, proxy, db, needle: bytes
) -> None:
    run_id = enqueue_echo(db, "claimed once", duration=0.1, max_attempts=1)
    writer = JournalWriter(pool)  # the journal's commits do not pass the proxy
    await writer.start()
    proxy.break_at(needle, deliver=True)
    d = _dispatcher(
        faulty_pool, writer, "retry-test", concurrency=1, lease_seconds=60
    )  # an orphaned claim would sit running for a minute, then fail
    await d.start()
    try:
        await wait_until_async(
            lambda: run_row(db, run_id)["status"] != "running" and run_row(db, run_id)["status"] != "queued",
            within=20,
            what="the run to end",
        )
    finally:
        await d.stop_claiming()
        await asyncio.gather(*d.tasks(), return_exceptions=True)
        await writer.stop()
    assert proxy.fired == [f"{needle.decode()} delivered"]
    row = run_row(db, run_id)
    assert (row["status"], row["attempt"]) == ("completed", 1)
    assert kinds(db, run_id).count("run_claimed") == 1
