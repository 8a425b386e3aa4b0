"""Stop-to-cancelled latency against a real `runrow worker` process.

The worker runs the echo handler (it streams metadata.echo as text deltas for 30 s). Each
sample enqueues a turn, waits until its text streams, stops the conversation at a random
moment, and tails the run until its `complete`. Latency is the database clock's
complete.created_at - cancel_requested.created_at: the stop's commit, the NOTIFY on
runrow_cancel, the worker's handler noticing, its journal flush and finish_run(cancelled).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from contextlib import aclosing

import psycopg
from psycopg_pool import AsyncConnectionPool

from bench.common import cli, event_times, percentile, run_alone, summary_ms
from pyworker.db import api
from pyworker.db.cancel_safe_pool import CancelSafePool
from pyworker.db.hub import Hub
from pyworker.db.tail import Event, tail

SAMPLES = 15
LEASE = 10


def start_worker(url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable, "-m", "pyworker", "--database-url", url, "--log-level", "WARNING",
            "worker", "--handler", "pyworker.worker.echo:handle", "--concurrency", "2",
            "--poll", "1", "--lease", str(LEASE), "--drain", "2",
        ],
        env={**os.environ, "DATABASE_URL": url},
    )  # fmt: skip


async def one_sample(
    url: str, pool: AsyncConnectionPool, hub: Hub, rng: random.Random
) -> tuple[float, float, str]:
    conversation = uuid.uuid4()
    async with pool.connection() as conn:
        enq = await api.enqueue_run(
            conn, conversation_id=conversation, content="stream", model="bench",
            metadata={"echo": "word " * 2000, "duration": 30},
        )  # fmt: skip
    stopped_at = 0.0
    async with aclosing(tail(pool, hub, enq.run_id, keepalive=30.0)) as items:
        async for item in items:
            if not isinstance(item, Event):
                continue
            if item.type == "text_delta" and not stopped_at:
                await asyncio.sleep(rng.uniform(0.0, 0.3))
                async with pool.connection() as conn:
                    await api.stop_conversation(conn, conversation)
                stopped_at = time.monotonic()
            if item.type == "complete":
                seen_end = time.monotonic() - stopped_at
                status = str(item.payload.get("status"))
                break
    with psycopg.connect(url, autocommit=True) as conn:
        t = event_times(conn, enq.run_id)
    return (t["complete"] - t["cancel_requested"]).total_seconds(), seen_end, status


async def bench(url: str, seed: int = 2) -> list[str]:
    rng = random.Random(seed)
    worker = start_worker(url)
    pool = CancelSafePool(url, min_size=1, max_size=4, kwargs={"autocommit": True}, open=False)
    await pool.open()
    hub = Hub(url, application_name="bench-tail")
    await hub.start()
    await hub.wait_connected(5)
    try:
        samples = [await asyncio.wait_for(one_sample(url, pool, hub, rng), 30) for _ in range(SAMPLES)]
    finally:
        await hub.stop()
        await pool.close()
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(10)
        except subprocess.TimeoutExpired:
            worker.kill()
    statuses = sorted({s for _, _, s in samples})
    return [
        "stop -> cancelled latency (real `runrow worker`, echo handler streaming)",
        f"  database clock: cancel_requested -> complete  {summary_ms([d for d, _, _ in samples])}",
        f"  client view: stop returned -> tail saw complete {summary_ms([c for _, c, _ in samples])}",
        f"  final statuses: {', '.join(statuses)}",
        f"  vs the heartbeat-poll fallback alone (lease 10 s / 3 = {LEASE / 3:.1f} s worst case): "
        f"p50 {LEASE / 3 / max(percentile([d for d, _, _ in samples], 50), 1e-9):.0f}x faster",
    ]


def main(argv: list[str] | None = None) -> None:
    cli("bench.stop_to_cancelled", __doc__).parse_args(sys.argv[1:] if argv is None else argv)
    run_alone("stop", bench)


if __name__ == "__main__":
    main()
