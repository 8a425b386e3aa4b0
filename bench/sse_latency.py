"""Append-to-browser latency through `runrow serve`: journal commit -> SSE frame at a client.

A `runrow serve` process (its own hub and pool, as in production) streams one run to K
concurrent viewers over real HTTP while this process appends text deltas one per
transaction (claim/append via SQL, 20 ms apart). Latency per frame is the viewer's receive
time minus the append's commit time, both on this machine's monotonic clock. Shows the
cost of fan-out: every viewer re-reads the journal (one pooled connection per read) on
every wake.

    runrow db run -- python -m bench.sse_latency     # or with DATABASE_URL set
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid

import httpx
import psycopg

from bench.common import bench_database, cli, machine, summary_ms

EVENTS = 100
GAP = 0.02
VIEWERS = (1, 25, 100)
TOKEN = "bench-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def one_round(base: str, url: str, viewers: int) -> list[float]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(
        base_url=base, timeout=60, limits=httpx.Limits(max_connections=viewers + 5)
    ) as c:
        posted = await c.post(
            f"/conversations/{uuid.uuid4()}/runs", json={"content": "bench"}, headers=headers
        )
        run_id = uuid.UUID(posted.json()["run_id"])
        with psycopg.connect(url, autocommit=True) as db:
            row = db.execute(
                "SELECT run_id, claim_token FROM runrow.claim_run(worker_id => 'bench')"
            ).fetchone()
            assert row is not None and row[0] == run_id
            token = row[1]
            committed: dict[int, float] = {}
            received: list[tuple[int, float]] = []
            ready = asyncio.Event()
            connected = 0

            async def viewer() -> None:
                nonlocal connected
                async with c.stream("GET", f"/runs/{run_id}/events", headers=headers) as response:
                    connected += 1
                    if connected == viewers:
                        ready.set()
                    seq = None
                    async for line in response.aiter_lines():
                        if line.startswith("id: "):
                            seq = int(line[4:])
                        elif line.startswith("data: ") and seq is not None:
                            received.append((seq, time.monotonic()))
                            if json.loads(line[6:])["type"] == "complete":
                                return

            tasks = [asyncio.create_task(viewer()) for _ in range(viewers)]
            await asyncio.wait_for(ready.wait(), 30)
            await asyncio.sleep(0.5)  # every viewer has caught up and waits on the hub
            for i in range(EVENTS):
                last = await asyncio.to_thread(
                    lambda i=i: db.execute(
                        "SELECT runrow.append_events(run_id => %s, claim_token => %s, events => %s::jsonb)",
                        (run_id, token, json.dumps([{"type": "text_delta", "text": f"{i} "}])),
                    ).fetchone()[0]
                )
                committed[last] = time.monotonic()
                await asyncio.sleep(GAP)
            db.execute(
                "SELECT runrow.finish_run(run_id => %s, claim_token => %s, status => 'completed')",
                (run_id, token),
            )
            await asyncio.gather(*tasks)
    return [at - committed[seq] for seq, at in received if seq in committed]


def bench(url: str) -> list[str]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "pyworker", "--log-level", "WARNING", "serve", "--port", str(port),
         "--model", "bench", "--shutdown-grace", "1"],
        env={**os.environ, "DATABASE_URL": url, "RUNROW_TOKENS": f"{TOKEN}=bench"},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        lines = [
            f"SSE append-to-client latency (runrow serve, pool 10, {EVENTS} deltas {GAP * 1000:.0f} ms apart)"
        ]
        for viewers in VIEWERS:
            latencies = asyncio.run(one_round(base, url, viewers))
            lines.append(f"  {viewers:>3} viewers of one run: {summary_ms(latencies)}")
        return lines
    finally:
        server.terminate()
        server.wait(15)


def main(argv: list[str] | None = None) -> None:
    cli("bench.sse_latency", __doc__).parse_args(sys.argv[1:] if argv is None else argv)
    with bench_database("sse") as url:
        print(machine(url))
        print("\n".join(bench(url)))


if __name__ == "__main__":
    main()
