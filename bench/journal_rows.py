"""Journal rows written per second of a streaming run: coalesced writer vs one row per delta.

One run streams text deltas on a fixed schedule (every 4 ms for 4 s: 1000 deltas, a fast
model). The coalesced writer (pyworker.worker.journal: deltas merge in memory, flushed every
250 ms) is set against a naive writer that calls append_events once per delta. Both
journals must spell the same text; the report gives rows, commits, rows per second of
streaming, and how far the naive writer fell behind its schedule.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

import psycopg
from psycopg_pool import AsyncConnectionPool

from bench.common import cli, run_alone
from pyworker.db import api
from pyworker.db.api import ClaimedRun
from pyworker.db.cancel_safe_pool import CancelSafePool
from pyworker.worker.journal import JournalWriter

DELTA_INTERVAL = 0.004
STREAM_SECONDS = 4.0
DELTAS = int(STREAM_SECONDS / DELTA_INTERVAL)


def piece(i: int) -> str:
    return f"tok{i} "


async def claim_new_run(conn: psycopg.AsyncConnection) -> ClaimedRun:
    await api.enqueue_run(conn, conversation_id=uuid.uuid4(), content="stream", model="bench")
    run = await api.claim_run(conn, "bench", 60)
    assert run is not None
    return run


async def on_schedule(start: float, i: int) -> None:
    delay = start + i * DELTA_INTERVAL - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def stream_coalesced(pool: AsyncConnectionPool, run: ClaimedRun) -> tuple[float, int]:
    writer = JournalWriter(pool, interval=0.25)
    journal = writer.run_journal(run)
    await writer.start()
    start = time.monotonic()
    for i in range(DELTAS):
        await on_schedule(start, i)
        await journal.emit({"type": "text_delta", "index": 0, "text": piece(i)})
    await journal.flush()
    elapsed = time.monotonic() - start
    await writer.stop()
    return elapsed, writer.ticks


async def stream_naive(conn: psycopg.AsyncConnection, run: ClaimedRun) -> tuple[float, int]:
    start = time.monotonic()
    for i in range(DELTAS):
        await on_schedule(start, i)
        await api.append_events(
            conn, run.run_id, run.claim_token, [{"type": "text_delta", "index": 0, "text": piece(i)}]
        )
    return time.monotonic() - start, DELTAS


async def delta_rows(conn: psycopg.AsyncConnection, run: ClaimedRun) -> tuple[int, str]:
    events = await api.read_events(conn, run.run_id, 0, 10000)
    deltas = [e for e in events if e.type == "text_delta"]
    await api.finish_run(conn, run.run_id, run.claim_token, "completed")
    return len(deltas), "".join(e.payload["text"] for e in deltas)


async def bench(url: str) -> list[str]:
    expected = "".join(piece(i) for i in range(DELTAS))
    pool = CancelSafePool(url, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False)
    await pool.open()
    lines = [
        f"journal rows of one streaming run ({DELTAS} deltas, one every {DELTA_INTERVAL * 1000:.0f} ms, "
        f"{STREAM_SECONDS:.0f} s scheduled)"
    ]
    results = {}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for name in ("coalesced (250 ms flush)", "naive (row per delta)"):
            run = await claim_new_run(conn)
            if name.startswith("coalesced"):
                elapsed, commits = await stream_coalesced(pool, run)
            else:
                elapsed, commits = await stream_naive(conn, run)
            rows, text = await delta_rows(conn, run)
            assert text == expected, f"{name}: the journal does not spell the streamed text"
            results[name] = rows
            lines.append(
                f"  {name:<26} rows={rows:>5} commits={commits:>5} stream took {elapsed:5.2f} s "
                f"({elapsed / STREAM_SECONDS:.2f}x schedule) -> {rows / elapsed:7.1f} rows/s"
            )
    await pool.close()
    coalesced, naive = results.values()
    lines.append(f"  ratio naive / coalesced rows: {naive / coalesced:.0f}x (same text in both journals)")
    return lines


def main(argv: list[str] | None = None) -> None:
    cli("bench.journal_rows", __doc__).parse_args(sys.argv[1:] if argv is None else argv)
    run_alone("journal", bench)


if __name__ == "__main__":
    main()
