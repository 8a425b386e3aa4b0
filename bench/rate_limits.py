"""A fleet against a rate-limited Messages API, with and without runrow's fleet limits.

The fake Messages API allows PER_SECOND requests a second (a token bucket, burst PER_SECOND)
and answers the rest 429 + retry-after, counting what it refused. WORKERS worker processes
(CONCURRENCY runs each) drain RUNS one-turn runs:

- with the limiter: the key's limit is set in the database (set_rate_limit), every request is
  acquired first, and a 429 blocks the key fleet-wide (report_rate_limited), as does a response
  whose rate-limit headers say the bucket is empty (report_rate_limit_exhausted);
- with the limiter and no limit set: the fleet knows only what the API's answers say (its
  rate-limit headers, its 429s);
- without (worker config fleet_limits: False): each worker meets the limit alone, its SDK
  retrying 429s (max_retries 2, honouring retry-after), then releasing the run with backoff.

Reported: refused requests, the most refused within one block (from a 429 to the end of its
retry-after), runs completed and wall time. `python -m bench.rate_limits` alone.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import sys
import time
import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bench.common import cli, run_alone
from pyworker.agent import loop as agent
from pyworker.fake.ratelimit import RateLimit, Refusal
from pyworker.fake.server import FakeModel
from pyworker.worker.process import Worker

WORKERS = 4
CONCURRENCY = 2
RUNS = 40
PER_SECOND = 3
TIMEOUT = 120.0


def blocks(refused: list[Refusal]) -> list[int]:
    """Refusals per block: a block starts at a refusal outside every earlier block and lasts
    its retry-after."""
    counts: list[int] = []
    until = float("-inf")
    for r in sorted(refused, key=lambda r: r.at):
        if r.at >= until:
            counts.append(0)
            until = r.at + r.retry_after
        counts[-1] += 1
    return counts


def _worker_main(url: str, name: str, base_url: str, limiter: bool) -> None:
    os.environ.update({"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "bench"})
    logging.disable(logging.CRITICAL)  # the baseline's hundreds of 429 warnings are the point, not the report
    code = 1
    try:
        worker = Worker(
            url,
            worker_id=name,
            handler=agent.handle,
            concurrency=CONCURRENCY,
            lease_seconds=10,
            poll_seconds=0.3,
            reap_interval=2,
            config={"fleet_limits": limiter},
        )
        code = asyncio.run(worker.run())
    finally:
        os._exit(code)


def measure(url: str, limiter: bool, known: bool = True) -> dict[str, Any]:
    """`known`: the key's limit is set in the database (with the limiter)."""
    model = f"bench-{'limited' if limiter else 'alone'}-{uuid.uuid4().hex[:6]}"
    limit = RateLimit(requests=PER_SECOND, per_seconds=1.0)
    with psycopg.connect(url, autocommit=True) as conn, FakeModel("text", rate_limit=limit) as fake:
        if limiter and known:
            conn.execute("SELECT runrow.set_rate_limit(%s, %s, NULL, NULL)", (model, PER_SECOND * 60))
        runs = [
            conn.execute(
                "SELECT run_id FROM runrow.enqueue_run(conversation_id => %s, content => %s, model => %s, "
                "max_attempts => 20)",
                (uuid.uuid4(), Jsonb(f"run {i}"), model),
            ).fetchone()[0]  # type: ignore[index]
            for i in range(RUNS)
        ]
        started = time.monotonic()
        context = multiprocessing.get_context("fork")
        procs = [
            context.Process(
                target=_worker_main, args=(url, f"bench-{n}", fake.base_url, limiter), daemon=True
            )
            for n in range(WORKERS)
        ]
        for p in procs:
            p.start()
        try:
            while time.monotonic() - started < TIMEOUT:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE status IN ('completed', 'failed', 'dead')), "
                    "count(*) FILTER (WHERE status = 'completed') FROM runrow.agent_run WHERE id = ANY(%s)",
                    (runs,),
                ).fetchone()
                assert row is not None
                if row[0] == RUNS:
                    break
                time.sleep(0.2)
            elapsed = time.monotonic() - started
        finally:
            for p in procs:
                if p.pid is not None and p.is_alive():
                    os.kill(p.pid, signal.SIGTERM)
            for p in procs:
                p.join(15)
                if p.is_alive() and p.pid is not None:
                    os.kill(p.pid, signal.SIGKILL)
                    p.join(5)
        refused = list(limit.refused)
    per_block = blocks(refused)
    return {
        "limiter": limiter,
        "refused": len(refused),
        "allowed": limit.allowed,
        "max_refused_per_block": max(per_block, default=0),
        "blocks": len(per_block),
        "completed": row[1],
        "seconds": round(elapsed, 1),
    }


async def bench(url: str) -> list[str]:
    lines = [
        f"rate limits: {WORKERS} workers x {CONCURRENCY} runs, {RUNS} runs, the API allows {PER_SECOND}/s "
        "(429 + retry-after beyond)"
    ]
    modes = {
        "each worker alone         ": (False, True),
        "with the fleet limiter    ": (True, True),
        "the limiter, no limit set ": (True, False),
    }
    for what, (limiter, known) in modes.items():
        m = await asyncio.to_thread(measure, url, limiter, known)
        lines.append(
            f"  {what}: {m['refused']:4d} refused ({m['max_refused_per_block']} at most in one block of "
            f"{m['blocks']}), {m['completed']}/{RUNS} completed in {m['seconds']} s"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    cli("bench.rate_limits", __doc__).parse_args(sys.argv[1:] if argv is None else argv)
    run_alone("rate_limits", bench)


if __name__ == "__main__":
    main()
