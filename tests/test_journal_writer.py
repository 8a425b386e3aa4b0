"""The journal writer: deltas coalesce, flush on the 250 ms clock, structural events write
through in order, all runs of a process flush in ONE transaction per tick, a run fenced
out of that transaction loses only its own events, and a flush whose COMMIT goes unanswered
is read back, not blindly retried: each event lands exactly once."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from wire_fault_support import faulty_pool, proxy
from worker_support import db, events, streamed_text, wait_until_async, worker_db

from pyworker.db import api, batch, nul
from pyworker.db.api import ClaimedRun
from pyworker.db.cancel_safe_pool import CancelSafePool
from pyworker.worker.handler import Outcome, RunContext
from pyworker.worker.journal import (
    BATCH_MIN_RUNS,
    GATHER_TURNS,
    MAX_BYTES_PER_CALL,
    MAX_EVENTS_PER_CALL,
    JournalError,
    JournalWriter,
    RunLost,
)
from pyworker.worker.logs import run_logger
from pyworker.worker.supervisor import RunSupervisor

__all__ = ["db", "faulty_pool", "proxy", "worker_db"]

CLOCK_OFF = 3600.0  # the clock never ticks: only explicit or write-through flushes write


@pytest.fixture
async def pool(worker_db: str) -> AsyncIterator[AsyncConnectionPool]:
    p = CancelSafePool(worker_db, min_size=1, max_size=4, kwargs={"autocommit": True}, open=False)
    await p.open()
    yield p
    await p.close()


async def claimed(pool: AsyncConnectionPool, n: int) -> list[ClaimedRun]:
    async with pool.connection() as conn:
        for _ in range(n):
            await api.enqueue_run(conn, uuid.uuid4(), "hi", "echo")
        runs = await api.claim_runs(conn, "journal-test", n, 60)
    assert len(runs) == n
    return runs


async def writer_for(pool: AsyncConnectionPool, interval: float) -> JournalWriter:
    w = JournalWriter(pool, interval=interval)
    await w.start()
    return w


def deltas(db, run_id: uuid.UUID) -> list[dict]:  # type: ignore[no-untyped-def]
    return [e for e in events(db, run_id) if e["type"].endswith("_delta")]


def transactions(db, run_ids: list[uuid.UUID]) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(transactions, rows) of the runs' delta rows. created_at is now(): the start of the
    top-level transaction, the same inside every savepoint (xmin is not: each savepoint that
    writes gets a subtransaction id of its own)."""
    row = db.execute(
        "SELECT count(DISTINCT created_at), count(*) FROM runrow.run_event "
        "WHERE run_id = ANY(%s) AND type = 'text_delta'",
        (run_ids,),
    ).fetchone()
    return row[0], row[1]


async def test_consecutive_deltas_of_one_stream_coalesce(pool, db) -> None:
    (run,) = await claimed(pool, 1)
    writer = await writer_for(pool, CLOCK_OFF)
    journal = writer.run_journal(run)
    script = (
        [{"type": "thinking_delta", "index": 0, "thinking": f"t{i} "} for i in range(50)]
        + [{"type": "text_delta", "index": 1, "text": f"a{i} "} for i in range(100)]
        + [{"type": "input_json_delta", "index": 2, "partial_json": f'"k{i}":{i},'} for i in range(30)]
        + [{"type": "text_delta", "index": 3, "text": f"b{i} "} for i in range(20)]
    )
    for event in script:
        await journal.emit(event)
    await writer.flush_all()
    rows = deltas(db, run.run_id)
    assert [(r["type"], r["index"]) for r in rows] == [
        ("thinking_delta", 0),
        ("text_delta", 1),
        ("input_json_delta", 2),
        ("text_delta", 3),  # same type as row 2 but another content block: not merged
    ]
    field = {"thinking_delta": "thinking", "text_delta": "text", "input_json_delta": "partial_json"}
    for row in rows:
        expected = "".join(e[field[row["type"]]] for e in script if e["index"] == row["index"])
        assert row[field[row["type"]]] == expected
    await writer.stop()


async def test_deltas_flush_on_a_250ms_clock(pool, db) -> None:
    (run,) = await claimed(pool, 1)
    writer = await writer_for(pool, 0.25)
    journal = writer.run_journal(run)
    text = ""
    for i in range(100):  # one delta every 10 ms for about a second
        piece = f"w{i} "
        text += piece
        await journal.emit({"type": "text_delta", "index": 0, "text": piece})
        await asyncio.sleep(0.01)
    await journal.flush()
    rows = db.execute(
        "SELECT created_at, payload->>'text' FROM runrow.run_event WHERE run_id = %s AND type = 'text_delta' "
        "ORDER BY seq",
        (run.run_id,),
    ).fetchall()
    assert "".join(r[1] for r in rows) == text  # nothing lost, nothing twice, in order
    assert 3 <= len(rows) <= 8  # ~1 s of deltas at 4 flushes a second, not 100 rows
    gaps = [(b[0] - a[0]).total_seconds() for a, b in itertools.pairwise(rows[:-1])]
    assert all(0.2 <= g <= 0.6 for g in gaps), gaps  # the database clock sees the 250 ms tick
    await writer.stop()


async def test_structural_event_writes_through_after_buffered_deltas(pool, db) -> None:
    (run,) = await claimed(pool, 1)
    writer = await writer_for(pool, CLOCK_OFF)
    journal = writer.run_journal(run)
    await journal.emit({"type": "text_delta", "index": 0, "text": "Let me "})
    await journal.emit({"type": "text_delta", "index": 0, "text": "check."})
    assert deltas(db, run.run_id) == []  # buffered
    await journal.emit({"type": "tool_use", "id": "tu_1", "name": "search"})
    # emit returned: committed, deltas first, then the structural event
    tail = [(e["type"], e.get("text")) for e in events(db, run.run_id)][-2:]
    assert tail == [("text_delta", "Let me check."), ("tool_use", None)]
    await writer.stop()


async def test_event_written_through_without_waiting_takes_the_burst_after_it(pool, db) -> None:
    """wait=False: emit returns before the commit, the flush starts with no clock and no flush
    call, and what the run emits and its ending right after join that one transaction."""
    alone, burst = await claimed(pool, 2)
    writer = await writer_for(pool, CLOCK_OFF)
    journal = writer.run_journal(alone)
    await journal.emit({"type": "message_start"}, wait=False)
    assert journal.writing_through  # returned before the commit
    # The write-through's own end, not the row: another session sees the commit before this
    # loop has read the COMMIT's answer (a make test on a loaded box caught the gap).
    await wait_until_async(lambda: not journal.writing_through, 5, "the write-through to end")
    assert "message_start" in [e["type"] for e in events(db, alone.run_id)]
    assert writer.ticks == 1

    journal = writer.run_journal(burst)
    await journal.emit({"type": "message_start"}, wait=False)
    await journal.emit({"type": "text_delta", "index": 0, "text": "hi"})
    await journal.emit({"type": "message_stop"}, wait=False)
    assert await writer.finish(journal, "completed", {"text": "hi"}) == (True, False)
    assert writer.ticks == 2  # one transaction for the three events and the ending
    kinds = [e["type"] for e in events(db, burst.run_id)]
    assert kinds[-4:] == ["message_start", "text_delta", "message_stop", "complete"]
    await writer.stop()


async def test_a_run_that_ends_in_its_burst_makes_no_write_through_task(pool, db) -> None:
    """A wait=False event's write-through task starts one loop turn later, and only if still
    needed: a zero-length run's ending, queued in the same burst, carries its events (one task
    less per run). Until then the event counts as writing through, so ctx.db flushes first."""
    ended, streaming = await claimed(pool, 2)
    writer = await writer_for(pool, CLOCK_OFF)
    created: list[str] = []
    loop = asyncio.get_running_loop()
    factory = loop.get_task_factory()

    def counting(loop, coro, **kwargs):  # type: ignore[no-untyped-def]
        created.append(getattr(coro, "__qualname__", "?"))
        return asyncio.Task(coro, loop=loop, **kwargs) if factory is None else factory(loop, coro, **kwargs)

    loop.set_task_factory(counting)
    try:
        journal = writer.run_journal(ended)
        await journal.emit({"type": "message_start"}, wait=False)
        assert journal.writing_through  # asked for, not started: ctx.db would flush first
        await journal.emit({"type": "message_stop"}, wait=False)
        assert await writer.finish(journal, "completed", {"text": ""}) == (True, False)
        assert "RunJournal._write_through" not in created
        assert not journal.writing_through and writer.ticks == 1

        journal = writer.run_journal(streaming)  # a run that goes on after its event: written through
        await journal.emit({"type": "message_start"}, wait=False)
        await wait_until_async(
            lambda: "message_start" in [e["type"] for e in events(db, streaming.run_id)],
            5,
            "the write-through",
        )
        assert created.count("RunJournal._write_through") == 1
    finally:
        loop.set_task_factory(factory)
    assert [e["type"] for e in events(db, ended.run_id)][-3:] == ["message_start", "message_stop", "complete"]
    await writer.stop()


async def test_a_group_whose_runs_have_all_ended_goes_without_waiting_out_its_turns(pool, db) -> None:
    """A group leader waits up to GATHER_TURNS event-loop turns for more runs to join, but once
    every run of the writer has queued its ending nothing more can: it goes at once (a
    zero-length run at --concurrency 1 took 23 loop turns, now 12). A run that registers
    and writes through after those first turns therefore forms the next group: without the
    early start it joined the leader's, still waiting out its turns."""
    ended, later = await claimed(pool, 2)
    writer = await writer_for(pool, CLOCK_OFF)
    journal = writer.run_journal(ended)
    await journal.emit({"type": "message_start"}, wait=False)
    ending = asyncio.create_task(writer.finish(journal, "completed", {"text": ""}))
    for _ in range(GATHER_TURNS // 2 + 2):
        await asyncio.sleep(0)
    await writer.run_journal(later).emit({"type": "message_start"})
    assert await ending == (True, False)
    assert writer.ticks == 2
    assert [e["type"] for e in events(db, ended.run_id)][-2:] == ["message_start", "complete"]
    await writer.stop()


async def test_event_written_through_without_waiting_for_a_fenced_out_run(pool, db) -> None:
    (run,) = await claimed(pool, 1)
    async with pool.connection() as conn:  # as a reaper or a stop would
        assert await api.finish_run(conn, run.run_id, run.claim_token, "failed", error="taken away")
    before = events(db, run.run_id)
    writer = await writer_for(pool, CLOCK_OFF)
    journal = writer.run_journal(run)
    await journal.emit({"type": "message_start"}, wait=False)  # the fence answers later
    await wait_until_async(journal.lost.is_set, 5, "the fence to set lost")
    with pytest.raises(RunLost):
        await journal.emit({"type": "message_stop"}, wait=False)
    assert events(db, run.run_id) == before
    await writer.stop()


async def test_failure_of_an_event_written_through_without_waiting_surfaces_at_the_next_call(
    pool, db
) -> None:
    (run,) = await claimed(pool, 1)
    writer = await writer_for(pool, CLOCK_OFF)
    journal = writer.run_journal(run)
    await journal.emit({"type": "text_delta", "index": 0, "text": "a\ud800b"})  # refused by jsonb
    await journal.emit({"type": "message_stop"}, wait=False)
    await wait_until_async(lambda: not journal.writing_through, 5, "the write-through to fail")
    with pytest.raises(JournalError, match="rejected events"):  # the ending does not go out
        await writer.finish(journal, "completed")
    assert [e["type"] for e in events(db, run.run_id)][-1] == "run_claimed"  # nothing written
    await writer.stop()


class Gate:
    """Holds the writer's statements (append_events, append_runs_events, finish_runs) before they
    are sent, so a test can take the run away between a deferred event's emit and its flush, on
    real connections."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.held = asyncio.Event()  # a statement is waiting at the gate
        self.open = asyncio.Event()
        for module, name in ((api, "append_events"), (batch, "append_runs_events"), (batch, "finish_runs")):
            monkeypatch.setattr(module, name, self._gated(getattr(module, name)))

    def _gated(self, real):  # type: ignore[no-untyped-def]
        async def gated(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.held.set()
            await self.open.wait()
            return await real(*args, **kwargs)

        return gated


async def test_deferred_flush_of_a_run_taken_away_stops_it_as_lost_and_its_ending_writes_nothing(
    pool, db, monkeypatch
) -> None:
    """The handler returns right after a wait=False event; its flush (the ending riding it) is
    held while the run is reaped and claimed again under another token. The supervisor must
    learn it as it would had the handler awaited the flush: its heartbeat says the run is no
    longer ours, it stops with 'lost' while the flush is still held, and once the flush goes out
    the fence turns it away. Before: the heartbeat stopped with the handler, and the supervisor
    waited on the held flush for good."""
    async with pool.connection() as conn:
        await api.enqueue_run(conn, uuid.uuid4(), "hi", "echo", max_attempts=2)
        (run,) = await api.claim_runs(conn, "journal-test", 1, 60)
    writer = await writer_for(pool, CLOCK_OFF)
    gate = Gate(monkeypatch)

    async def handler(ctx: RunContext) -> Outcome:
        await ctx.journal.emit({"type": "message_start", "role": "assistant"}, wait=False)
        return Outcome("completed", result={"text": ""})

    supervisor = RunSupervisor(
        run, pool=pool, writer=writer, handler=handler, lease_seconds=3, worker_id="journal-test"
    )
    supervised = asyncio.create_task(supervisor.supervise())
    await asyncio.wait_for(gate.held.wait(), 10)
    async with pool.connection() as conn:  # taken away meanwhile: reaped, then claimed again
        await conn.execute(
            "UPDATE runrow.agent_run SET claim_expires_at = now() - interval '1 second' WHERE id = %s",
            (run.run_id,),
        )
        assert (run.run_id, "requeued") in await api.reap_expired_runs(conn, 0, 10)
        (again,) = await api.claim_runs(conn, "other-worker", 1, 60)
    assert again.run_id == run.run_id and again.claim_token != run.claim_token
    before = events(db, run.run_id)
    # The heartbeat beats every lease/3 = 1 s; the bound only keeps a failure from hanging.
    assert await asyncio.wait_for(supervised, 20) == "lost"
    gate.open.set()
    await writer.stop()  # whatever was held goes out now: fenced, nothing written
    assert events(db, run.run_id) == before
    assert "message_start" not in [e["type"] for e in before]
    status = db.execute("SELECT status, worker_id FROM runrow.agent_run WHERE id = %s", (run.run_id,))
    assert status.fetchone() == ("running", "other-worker")


async def test_ending_after_a_refused_deferred_event_is_refused_and_nothing_after_it_is_written(
    pool, db, monkeypatch
) -> None:
    """A wait=False event's batch is refused while the run goes on emitting and ends: what came
    after it must not land behind the gap, and the ending must not report the run finished.
    Before: the later delta and a 'completed' ending were written, the refused events missing."""
    (run,) = await claimed(pool, 1)
    writer = await writer_for(pool, CLOCK_OFF)
    gate = Gate(monkeypatch)
    journal = writer.run_journal(run)
    await journal.emit({"type": "text_delta", "index": 0, "text": "a\ud800b"})  # refused by jsonb
    await journal.emit({"type": "message_stop"}, wait=False)
    await asyncio.wait_for(gate.held.wait(), 10)  # that flush has taken both, not sent yet
    await journal.emit({"type": "text_delta", "index": 1, "text": "after"})
    ending = asyncio.create_task(writer.finish(journal, "completed", {"text": "after"}))
    await wait_until_async(lambda: journal._ending is not None, 5, "the ending to be queued")
    gate.open.set()
    with pytest.raises(JournalError, match="rejected events"):
        await asyncio.wait_for(ending, 10)
    kinds = [e["type"] for e in events(db, run.run_id)]
    assert kinds[-1] == "run_claimed", kinds  # nothing written: not the later delta, not the ending
    await writer.stop()


async def test_ctx_db_waits_for_an_event_written_through_without_waiting(pool, db) -> None:
    """The handler's own SQL may journal, park or end the run: it must not overtake the event."""
    (run,) = await claimed(pool, 1)
    writer = await writer_for(pool, CLOCK_OFF)
    journal = writer.run_journal(run)
    ctx = RunContext(
        run=run,
        pool=pool,
        journal=journal,
        cancel=asyncio.Event(),
        lost=journal.lost,
        log=run_logger(run, "journal-test"),
        worker_id="journal-test",
    )
    await journal.emit({"type": "tool_result", "tool_use_id": "tu_1"}, wait=False)

    async def committed(conn: psycopg.AsyncConnection) -> bool:  # asked as the call goes out
        return journal._committed == journal._emitted

    assert await ctx.db(committed, "the handler's call")
    await writer.stop()


async def test_all_runs_flush_in_one_transaction_per_tick(pool, db) -> None:
    runs = await claimed(pool, 5)
    writer = await writer_for(pool, 0.25)
    journals = [writer.run_journal(r) for r in runs]
    for i in range(20):
        for j in journals:  # no await yields to the clock between these: one tick takes all
            await j.emit({"type": "text_delta", "index": 0, "text": f"{i} "})
    for j in journals:
        await j.flush()
    assert transactions(db, [r.run_id for r in runs]) == (1, 5)  # five runs, one row each, one transaction
    await writer.stop()


def count_appends(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[uuid.UUID]]:
    """(runs per append_runs_events call, runs sent through append_events), as the writer calls them."""
    batched: list[int] = []
    singles: list[uuid.UUID] = []
    append_runs, append_one = batch.append_runs_events, api.append_events

    async def runs_counted(conn, appends):  # type: ignore[no-untyped-def]
        batched.append(len(appends))
        return await append_runs(conn, appends)

    async def one_counted(conn, run_id, *args, **kwargs):  # type: ignore[no-untyped-def]
        singles.append(run_id)
        return await append_one(conn, run_id, *args, **kwargs)

    monkeypatch.setattr(batch, "append_runs_events", runs_counted)
    monkeypatch.setattr(api, "append_events", one_counted)
    return batched, singles


async def test_a_flush_appends_every_run_in_one_statement(pool, db, monkeypatch) -> None:
    """One append_runs_events per flush, whatever the number of streaming runs: one append_events
    per run before, a round trip and a statement each on every tick."""
    batched, singles = count_appends(monkeypatch)
    runs = await claimed(pool, 5)
    writer = await writer_for(pool, CLOCK_OFF)
    journals = [writer.run_journal(r) for r in runs]
    for i, j in enumerate(journals):
        await emit_text(j, [f"run {i} ", "says hi"])
    await writer.flush_all()
    assert (batched, singles) == ([5], [])
    for i, r in enumerate(runs):
        assert shape(journal_of(db, r.run_id)) == [("text_delta", f"run {i} says hi")]
    assert transactions(db, [r.run_id for r in runs]) == (1, 5)
    await writer.stop()


async def test_a_run_past_one_calls_limit_takes_a_second_round_alone(pool, db, monkeypatch) -> None:
    """A run with more events than one call takes (MAX_EVENTS_PER_CALL) sends the rest in a
    second round of the same transaction; a run fenced out in the first sends no second round."""
    batched, singles = count_appends(monkeypatch)
    assert BATCH_MIN_RUNS <= 4
    big, small, other, taken = await claimed(pool, 4)
    writer = await writer_for(pool, CLOCK_OFF)
    jbig, jsmall, jother, jtaken = (writer.run_journal(r) for r in (big, small, other, taken))
    async with pool.connection() as conn:  # someone else ends `taken` first
        assert await api.finish_run(conn, taken.run_id, taken.claim_token, "failed", error="taken away")
    n = MAX_EVENTS_PER_CALL + 5
    for i in range(n):  # a content block each: nothing coalesces
        await jbig.emit({"type": "text_delta", "index": i, "text": f"{i}"})
        await jtaken.emit({"type": "text_delta", "index": i, "text": f"{i}"})
    await emit_text(jsmall, ["small"])
    await emit_text(jother, ["other"])
    await writer.flush_all()
    assert (batched, singles) == ([4, 1], [])  # the second round: big alone, not taken
    assert [(r["index"], r["text"]) for r in journal_of(db, big.run_id)] == [(i, f"{i}") for i in range(n)]
    assert shape(journal_of(db, small.run_id)) == [("text_delta", "small")]
    assert deltas(db, taken.run_id) == [] and jtaken.lost.is_set()
    assert jbig.last_seq == len(events(db, big.run_id))
    await writer.stop()


async def test_a_flush_of_a_few_runs_appends_each_on_its_own(pool, db, monkeypatch) -> None:
    """Below BATCH_MIN_RUNS runs, append_events each: a batch call's fixed cost is more than the
    statements it saves there."""
    batched, singles = count_appends(monkeypatch)
    runs = await claimed(pool, BATCH_MIN_RUNS - 1)
    writer = await writer_for(pool, CLOCK_OFF)
    for i, j in enumerate(writer.run_journal(r) for r in runs):
        await emit_text(j, [f"run {i}"])
    await writer.flush_all()
    assert (batched, sorted(singles)) == ([], sorted(r.run_id for r in runs))
    assert transactions(db, [r.run_id for r in runs]) == (1, len(runs))
    await writer.stop()


async def test_fenced_out_run_loses_only_its_own_events(pool, db) -> None:
    a, b, c = await claimed(pool, 3)
    writer = await writer_for(pool, CLOCK_OFF)
    ja, jb, jc = (writer.run_journal(r) for r in (a, b, c))
    # Someone else ends b (as a reaper or a stop would): its token no longer matches a running run.
    async with pool.connection() as conn:
        assert await api.finish_run(conn, b.run_id, b.claim_token, "failed", error="taken away")
    for j in (ja, jb, jc):
        await j.emit({"type": "text_delta", "index": 0, "text": f"from {j.run_id}"})
    await writer.flush_all()

    assert [d["text"] for d in deltas(db, a.run_id)] == [f"from {a.run_id}"]
    assert [d["text"] for d in deltas(db, c.run_id)] == [f"from {c.run_id}"]
    assert deltas(db, b.run_id) == []
    assert jb.lost.is_set() and not ja.lost.is_set() and not jc.lost.is_set()
    assert transactions(db, [a.run_id, c.run_id]) == (1, 2)  # a and c still committed together
    with pytest.raises(RunLost):
        await jb.emit({"type": "text_delta", "index": 0, "text": "more"})
    await writer.stop()


async def test_two_claims_of_one_run_keep_separate_journals(pool, db) -> None:
    """A worker paused past its lease can claim its own run again while the stale attempt is
    still standing down: each attempt flushes and closes only its own journal."""
    async with pool.connection() as conn:
        await api.enqueue_run(conn, uuid.uuid4(), "hi", "echo", max_attempts=2)
        (first,) = await api.claim_runs(conn, "journal-test", 1, 60)
    writer = await writer_for(pool, CLOCK_OFF)
    stale = writer.run_journal(first)
    await emit_text(stale, ["stale "])
    async with pool.connection() as conn:  # as the reaper would: the first claim is gone
        assert await api.release_run(conn, first.run_id, first.claim_token, "reaped") == "requeued"
        (second,) = await api.claim_runs(conn, "journal-test", 1, 60)
    assert (second.run_id, second.attempt) == (first.run_id, 2)
    fresh = writer.run_journal(second)
    await emit_text(fresh, ["the new ", "answer"])

    with pytest.raises(RunLost):  # the stale buffer is fenced out, not taken for the new one's
        await stale.flush()
    assert stale.lost.is_set() and not fresh.lost.is_set()
    stale.close()  # the stale supervisor's cleanup
    await emit_text(fresh, [", whole"])
    await fresh.emit({"type": "message_stop"})  # writes through, the buffered deltas first
    async with pool.connection() as conn:
        assert await api.finish_run(conn, second.run_id, second.claim_token, "completed")
    rows = events(db, first.run_id)
    last_claim = max(i for i, e in enumerate(rows) if e["type"] == "run_claimed")
    attempt = rows[last_claim + 1 :]
    assert "".join(e.get("text", "") for e in attempt) == "the new answer, whole"
    assert [e["type"] for e in attempt if e["type"] != "text_delta"] == ["message_stop", "complete"]
    assert "stale" not in streamed_text(db, first.run_id)
    await writer.stop()


# --- a COMMIT that goes unanswered ---------------------------------------------------------


def journal_of(db, run_id: uuid.UUID) -> list[dict]:  # type: ignore[no-untyped-def]
    """The run's journal, checked gap-free from seq 1, without the enqueue-time prefix."""
    rows = events(db, run_id)
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    return [r for r in rows if not r["type"].startswith("run_") and r["type"] != "user_message_created"]


def shape(rows: list[dict]) -> list[tuple[str, str | None]]:
    return [(r["type"], r.get("text")) for r in rows]


async def emit_text(journal, pieces: list[str]) -> None:  # type: ignore[no-untyped-def]
    for piece in pieces:
        await journal.emit({"type": "text_delta", "index": 0, "text": piece})


async def test_commit_that_landed_but_went_unanswered_is_not_written_again(
    faulty_pool, proxy, db, caplog
) -> None:
    a, b = await claimed(faulty_pool, 2)
    writer = await writer_for(faulty_pool, CLOCK_OFF)
    ja, jb = writer.run_journal(a), writer.run_journal(b)
    await emit_text(ja, ["Hel", "lo, ", "world"])
    await emit_text(jb, ["Good", "bye"])
    before = {r: len(events(db, r)) for r in (a.run_id, b.run_id)}

    proxy.break_at(b"COMMIT", deliver=True)
    await writer.flush_all()  # committed: the read-back finds both batches, nothing to retry
    assert proxy.fired == ["COMMIT delivered"]
    assert "had committed" in caplog.text
    assert not ja.in_doubt and not jb.in_doubt and not ja.pending and not jb.pending
    assert ja.last_seq == before[a.run_id] + 1 and jb.last_seq == before[b.run_id] + 1

    await ja.emit({"type": "tool_use", "id": "tu_1", "name": "search"})  # writes through, later seq
    await writer.flush_all()
    assert shape(journal_of(db, a.run_id)) == [("text_delta", "Hello, world"), ("tool_use", None)]
    assert shape(journal_of(db, b.run_id)) == [("text_delta", "Goodbye")]
    assert writer.ticks == 2
    await writer.stop()


@pytest.mark.parametrize(
    ("needle", "n"),
    [
        (b"COMMIT", 2),
        (b"append_events", 2),
        (b"COMMIT", BATCH_MIN_RUNS),
        (b"append_runs_events", BATCH_MIN_RUNS),
    ],
    ids=[
        "connection-lost-at-commit-not-delivered",
        "connection-lost-before-commit",
        "batched-connection-lost-at-commit-not-delivered",
        "batched-connection-lost-before-commit",
    ],
)
async def test_flush_that_did_not_commit_is_written_again_once(
    faulty_pool, proxy, db, caplog, needle: bytes, n: int
) -> None:
    runs = await claimed(faulty_pool, n)
    writer = await writer_for(faulty_pool, CLOCK_OFF)
    journals = [writer.run_journal(r) for r in runs]
    ja = journals[0]
    await emit_text(ja, ["Hel", "lo"])
    for j in journals[1:]:
        await emit_text(j, ["Good", "bye"])

    proxy.break_at(needle, deliver=False)
    with pytest.raises(psycopg.OperationalError):
        await writer.flush_all()
    assert proxy.fired == [f"{needle.decode()} dropped"]
    # Only an unanswered COMMIT needs a read-back; dying before it sent the COMMIT rolls back.
    assert ("had not committed" in caplog.text) == (needle == b"COMMIT")
    assert all(j.pending and not j.in_doubt for j in journals)
    assert all(journal_of(db, r.run_id) == [] for r in runs)

    await emit_text(ja, [", world"])  # emitted meanwhile: follows the restored batch, in order
    await writer.flush_all()
    assert streamed_text(db, runs[0].run_id) == "Hello, world"
    for r in runs[1:]:
        assert shape(journal_of(db, r.run_id)) == [("text_delta", "Goodbye")]
    assert ja.last_seq == len(events(db, runs[0].run_id))
    await writer.stop()


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
async def test_read_back_sees_through_a_cancel_requested_written_meanwhile(
    faulty_pool, proxy, db, committed: bool
) -> None:
    (run,) = await claimed(faulty_pool, 1)
    writer = await writer_for(faulty_pool, CLOCK_OFF)
    journal = writer.run_journal(run)
    await emit_text(journal, ["Hello, ", "world"])

    proxy.break_at(b"COMMIT", deliver=committed)
    proxy.break_at(b"read_events", deliver=False)  # the read-back fails too: the batch stays in doubt
    with pytest.raises(psycopg.OperationalError):
        await writer.flush_all()
    assert proxy.fired == [f"COMMIT {'delivered' if committed else 'dropped'}", "read_events dropped"]
    assert journal.in_doubt

    # Meanwhile a stop journals cancel_requested into the running run: right after our batch if
    # it committed, else at the very seq our batch had been given.
    with psycopg.connect(proxy.target_url, autocommit=True) as conn:
        assert conn.execute("SELECT runrow.cancel_run(run_id => %s)", (run.run_id,)).fetchone() == (
            "cancel_requested",
        )
    await emit_text(journal, [" again"])  # buffered behind the batch in doubt, not written before it
    await writer.flush_all()

    expected = [("text_delta", "Hello, world"), ("cancel_requested", None), ("text_delta", " again")]
    if not committed:
        expected = [("cancel_requested", None), ("text_delta", "Hello, world"), ("text_delta", " again")]
    assert shape(journal_of(db, run.run_id)) == expected
    await writer.stop()


async def test_read_back_does_not_mistake_an_earlier_attempts_identical_events_for_the_batch(
    faulty_pool, proxy, db
) -> None:
    """A requeued run's second attempt may stream exactly what the first one did: matching the
    journal's text instead of the seqs the batch was given would call the batch written."""
    async with faulty_pool.connection() as conn:
        await api.enqueue_run(conn, uuid.uuid4(), "hi", "echo", max_attempts=2)
        (first,) = await api.claim_runs(conn, "journal-test", 1, 60)
    writer = await writer_for(faulty_pool, CLOCK_OFF)
    journal = writer.run_journal(first)
    await emit_text(journal, ["same ", "words"])
    await journal.flush()
    journal.close()
    async with faulty_pool.connection() as conn:
        assert await api.release_run(conn, first.run_id, first.claim_token, "try again") == "requeued"
        (second,) = await api.claim_runs(conn, "journal-test", 1, 60)
    assert second.run_id == first.run_id and second.attempt == 2

    journal = writer.run_journal(second)
    await emit_text(journal, ["same ", "words"])
    proxy.break_at(b"COMMIT", deliver=False)
    with pytest.raises(psycopg.OperationalError):
        await writer.flush_all()
    await writer.flush_all()
    texts = [r["text"] for r in journal_of(db, first.run_id) if r["type"] == "text_delta"]
    assert texts == ["same words", "same words"]  # once per attempt
    await writer.stop()


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
async def test_flush_cancelled_while_waiting_for_its_commit_settles_on_the_next_flush(
    faulty_pool, proxy, db, committed: bool
) -> None:
    """stop() cancels the clock task, which may be waiting on COMMIT: the batch is neither
    dropped (it may not have committed) nor retried blindly (it may have)."""
    (run,) = await claimed(faulty_pool, 1)
    writer = await writer_for(faulty_pool, CLOCK_OFF)
    journal = writer.run_journal(run)
    await emit_text(journal, ["Hello, ", "world"])

    proxy.break_at(b"COMMIT", deliver=committed, hold=True)
    flush = asyncio.create_task(writer.flush_all())
    await proxy.holding.wait()  # the server answered the COMMIT, or never saw it; the client waits
    flush.cancel()  # psycopg sends a cancel request, which releases the held connection
    with pytest.raises(asyncio.CancelledError):
        await flush
    assert journal.in_doubt

    await writer.flush_all()
    assert shape(journal_of(db, run.run_id)) == [("text_delta", "Hello, world")]
    assert not journal.in_doubt and not journal.pending
    assert journal.last_seq == len(events(db, run.run_id))
    await writer.stop()


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
async def test_batch_of_several_append_calls_is_read_back_whole(
    faulty_pool, proxy, db, committed: bool
) -> None:
    (run,) = await claimed(faulty_pool, 1)
    writer = await writer_for(faulty_pool, CLOCK_OFF)
    journal = writer.run_journal(run)
    n = MAX_EVENTS_PER_CALL + 300  # two append_events calls in the one transaction
    for i in range(n):  # a new content block each: nothing coalesces
        await journal.emit({"type": "text_delta", "index": i, "text": f"{i} "})

    proxy.break_at(b"COMMIT", deliver=committed)
    if committed:
        await writer.flush_all()
    else:
        with pytest.raises(psycopg.OperationalError):
            await writer.flush_all()
        await writer.flush_all()
    rows = journal_of(db, run.run_id)
    assert [(r["index"], r["text"]) for r in rows] == [(i, f"{i} ") for i in range(n)]
    assert journal.last_seq == len(events(db, run.run_id))
    await writer.stop()


async def test_events_with_a_nul_over_the_byte_limit_are_stored_encoded_once_in_order(pool, db) -> None:
    """_chunks encodes each event once (nul.encode_sized) and hands the encoded events both to
    the append calls and to the ending: a batch bigger than one call's bytes, whose strings hold
    NULs and percent signs, comes back exactly as emitted."""
    (run,) = await claimed(pool, 1)
    writer = await writer_for(pool, CLOCK_OFF)
    journal = writer.run_journal(run)
    big = MAX_BYTES_PER_CALL // 3 + 1  # three of them do not fit one call
    emitted = [{"type": "text_delta", "index": i, "text": f"{i}\x00 100%" + "x" * big} for i in range(4)]
    emitted.append({"type": "text_delta", "index": 9, "text": "\\u0000 is no NUL"})
    for event in emitted:
        await journal.emit(event)
    assert await writer.finish(journal, "completed") == (True, False)
    rows = [nul.decode({k: v for k, v in r.items() if k != "seq"}) for r in journal_of(db, run.run_id)]
    assert rows[:-1] == emitted
    assert rows[-1]["type"] == "complete" and rows[-1]["status"] == "completed"
    stored = [r for r in events(db, run.run_id) if r["type"] == "text_delta"]
    assert [r.get(nul.MARKER) for r in stored] == [nul.SCHEME] * 4 + [None]
    await writer.stop()


async def test_events_without_a_nul_are_not_walked_for_one(pool, db, monkeypatch) -> None:
    """The common case costs one json.dumps per event, which both sizes it and shows it holds no
    NUL: nul.has_nul (a walk in Python, twice per event before) is not called at all."""
    walks: list[object] = []
    has_nul = nul.has_nul
    monkeypatch.setattr(nul, "has_nul", lambda value: walks.append(value) or has_nul(value))
    (run,) = await claimed(pool, 1)
    writer = await writer_for(pool, CLOCK_OFF)
    journal = writer.run_journal(run)
    await journal.emit({"type": "message_start", "message": {"id": "m", "content": []}}, wait=False)
    await journal.emit({"type": "text_delta", "index": 0, "text": "no NUL here"})
    await journal.emit({"type": "message_stop"}, wait=False)
    assert await writer.finish(journal, "completed", result={"text": "no NUL here"}) == (True, False)
    assert [r["type"] for r in journal_of(db, run.run_id)] == [
        "message_start",
        "text_delta",
        "message_stop",
        "complete",
    ]
    assert [w for w in walks if isinstance(w, dict) and "type" in w] == []  # the result's walk only
    await writer.stop()


@pytest.mark.parametrize("kind", ["comp\r\nlete", "x\x1b]0;title\x07", "x\x7f", "x\x85y", "x\x9b2J"])
async def test_a_type_with_a_control_character_is_refused_at_emit_and_spoils_no_other_run(
    pool, db, kind: str
) -> None:
    """The SQL writers refuse such a type (22023, functions/_event_rules.sql); one in a group
    flush would fail every run's events in that call. emit refuses it, and the other run's
    event goes out in the flush as ever."""
    run, other = await claimed(pool, 2)
    writer = await writer_for(pool, CLOCK_OFF)
    journal, beside = writer.run_journal(run), writer.run_journal(other)
    await beside.emit({"type": "text_delta", "text": "fine"})
    with pytest.raises(ValueError, match="no control character"):
        await journal.emit({"type": kind})
    await writer.flush_all()
    assert [e["type"] for e in events(db, run.run_id)][-1] == "run_claimed"
    assert [e["type"] for e in events(db, other.run_id)][-1] == "text_delta"
    await writer.stop()


@pytest.mark.parametrize(
    "kind", ["complete", "run_claimed", "cancel_requested", "approval_resolved", "budget_exhausted", "", 7]
)
async def test_a_handler_cannot_emit_a_type_runrow_journals_itself(pool, db, kind: object) -> None:
    """Tails and UIs read runrow's own events (a pending stop, an approval, a spent budget) as the
    database's word: emit refuses them, and nothing reaches the journal."""
    (run,) = await claimed(pool, 1)
    writer = await writer_for(pool, CLOCK_OFF)
    journal = writer.run_journal(run)
    with pytest.raises(ValueError, match="not one runrow journals itself"):
        await journal.emit({"type": kind})
    await writer.flush_all()
    assert [e["type"] for e in events(db, run.run_id)] == [
        "user_message_created",
        "run_queued",
        "run_claimed",
    ]
