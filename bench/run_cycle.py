"""Whole runs per second through one primary: enqueue → claim → journal → finish, SQL only.

Each client loops over one short run's life in four calls (four commits, like a worker's
smallest run: the enqueue, the claim, one journal flush of a few events, the finish), with no
model and no handler, so the number is what the database sustains, not what a worker does.
Reported for 1 and 4 concurrent clients; with `fsync` on it includes the WAL flushes a real
server pays. Not in `make bench` (the throwaway cluster there has fsync off):

    DATABASE_URL=... python -m bench.run_cycle
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

from psycopg_pool import AsyncConnectionPool

from bench.common import cli, run_alone
from pyworker.db import api

SECONDS = 8.0
EVENTS = [{"type": "message_start", "role": "assistant"}] + [
    {"type": "text_delta", "index": 0, "text": "word " * 20} for _ in range(3)
]


async def client(pool: AsyncConnectionPool, until: float, name: str) -> int:
    done = 0
    while time.monotonic() < until:
        async with pool.connection() as conn:
            await api.enqueue_run(conn, conversation_id=uuid.uuid4(), content="cycle", model="bench")
            claimed = await api.claim_run(conn, name, 30)
            if claimed is None:  # another client took this one: it finishes it
                continue
            await api.append_events(conn, claimed.run_id, claimed.claim_token, EVENTS)
            await api.finish_run(conn, claimed.run_id, claimed.claim_token, "completed", {"text": "ok"})
            done += 1
    return done


async def bench(url: str) -> list[str]:
    lines = ["run cycle (enqueue, claim, 1 journal flush, finish: 4 commits per run)"]
    for clients in (1, 4):
        kwargs = {"autocommit": True}
        async with AsyncConnectionPool(url, min_size=clients, max_size=clients, kwargs=kwargs) as pool:
            until = time.monotonic() + SECONDS
            counts = await asyncio.gather(*(client(pool, until, f"bench-{i}") for i in range(clients)))
        runs = sum(counts)
        rate = runs / SECONDS
        lines.append(f"  {clients} client(s): {rate:.0f} runs/s ({4 * rate:.0f} commits/s)")
    return lines


def main(argv: list[str] | None = None) -> None:
    cli("bench.run_cycle", __doc__).parse_args(sys.argv[1:] if argv is None else argv)
    run_alone("cycle", bench)


if __name__ == "__main__":
    main()
