"""Enqueue-to-claim latency, woken by NOTIFY versus polling with the hub down.

A dispatcher loop like the worker's (claim; when the queue is empty, wait for a wake on
runrow_enqueued with the poll tick as timeout) runs against a stream of enqueues spaced at
random, so most arrive while it is parked. Latency is the database clock's
run_claimed.created_at - run_queued.created_at of each run. With the hub down the same loop
can only poll, every 1 s: the wait a run sits through is whatever is left of the tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
import uuid
from typing import Any

import psycopg

from bench.common import cli, event_times, percentile, run_alone, summary_ms
from pyworker.db import api
from pyworker.db.channels import ENQUEUED
from pyworker.db.hub import Hub

TICK = 1.0


async def dispatcher(url: str, hub: Hub | None, stop: asyncio.Event) -> int:
    """Claim and finish runs until `stop`; idle-wait on the hub, or sleep the tick without one."""
    claimed = 0
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        subscription: Any = hub.subscribe(ENQUEUED) if hub is not None else contextlib.nullcontext(None)
        # Subscribed for the whole loop, drained before each claim: an enqueue that commits
        # between an empty claim and the wait still wakes it.
        async with subscription as queue:
            while not stop.is_set():
                while queue is not None and not queue.empty():
                    queue.get_nowait()
                run = await api.claim_run(conn, "bench", 30)
                if run is not None:
                    claimed += 1
                    await api.finish_run(conn, run.run_id, run.claim_token, "completed")
                    continue
                waits = [asyncio.ensure_future(stop.wait())]
                if queue is not None and hub is not None and hub.connected:
                    waits.append(asyncio.ensure_future(queue.get()))
                _, pending = await asyncio.wait(waits, timeout=TICK, return_when=asyncio.FIRST_COMPLETED)
                for task in pending:
                    task.cancel()
    return claimed


async def measure(
    url: str, use_hub: bool, runs: int, gap: tuple[float, float], rng: random.Random
) -> list[float]:
    hub = Hub(url, application_name="bench-hub") if use_hub else None
    if hub is not None:
        await hub.start()
        await hub.wait_connected(5)
    stop = asyncio.Event()
    loop_task = asyncio.create_task(dispatcher(url, hub, stop))
    run_ids: list[uuid.UUID] = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for _ in range(runs):
            await asyncio.sleep(rng.uniform(*gap))
            enq = await api.enqueue_run(conn, conversation_id=uuid.uuid4(), content="ping", model="bench")
            run_ids.append(enq.run_id)
        deadline = time.monotonic() + 10 * TICK
        while time.monotonic() < deadline:
            cur = await conn.execute(
                "SELECT count(*) FROM unnest(%s::uuid[]) AS r(id), runrow.get_run(run_id => r.id) AS g "
                "WHERE g.status = 'completed'",
                (run_ids,),
            )
            row = await cur.fetchone()
            if row is not None and row[0] == len(run_ids):
                break
            await asyncio.sleep(0.1)
    stop.set()
    await loop_task
    if hub is not None:
        await hub.stop()
    latencies = []
    with psycopg.connect(url, autocommit=True) as conn:
        for run_id in run_ids:
            t = event_times(conn, run_id)
            if "run_claimed" in t:
                latencies.append((t["run_claimed"] - t["run_queued"]).total_seconds())
    return latencies


async def bench(url: str, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    notify = await measure(url, True, runs=200, gap=(0.005, 0.04), rng=rng)
    polled = await measure(url, False, runs=25, gap=(0.1, 0.7), rng=rng)
    ratio = percentile(polled, 50) / max(percentile(notify, 50), 1e-9)
    return [
        "enqueue -> claim latency (database clock: run_queued -> run_claimed)",
        f"  {'NOTIFY wake (hub up)':<28}{summary_ms(notify)}",
        f"  {f'hub down, poll every {TICK:.0f} s':<28}{summary_ms(polled)}",
        f"  ratio p50 polled / NOTIFY: {ratio:.0f}x",
    ]


def main(argv: list[str] | None = None) -> None:
    cli("bench.enqueue_to_claim", __doc__).parse_args(sys.argv[1:] if argv is None else argv)
    run_alone("claim", bench)


if __name__ == "__main__":
    main()
