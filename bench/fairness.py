"""Fair claiming: one tenant's backlog must not hold back the others (issue 14).

Tenant A enqueues BIG runs, then tenants B..E enqueue SMALL runs each; WORKERS SQL-level
workers (a connection each: claim_run, sleep RUN_SECONDS, finish_run) drain the queue. Each
run's wait is enqueue to claim on the database clock (created_at to started_at). Three rounds:

- fair: every tenant under its own fairness key, the claim's fair order;
- fifo: every run under one fairness key, so the claim serves arrival order (the behaviour
  before fairness), showing the head-of-line blocking;
- alone: B..E without A, the wait they would have with A absent.

A round ends once every run of B..E has been claimed (A's remaining backlog is left). The
goal: B..E's p99 in the fair round within 2x of the alone round, while A keeps a share.

`python -m bench.fairness [--short]` runs it alone (--short: A enqueues 1,000).
"""

from __future__ import annotations

import sys
import threading
import time

import psycopg

from bench.common import cli, percentile, run_alone

SMALL = 10
TENANTS = ["B", "C", "D", "E"]
WORKERS = 4
RUN_SECONDS = 0.05


def worker(url: str, name: str, stop: threading.Event) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            row = conn.execute("SELECT run_id, claim_token FROM runrow.claim_run(%s, 60)", (name,)).fetchone()
            if row is None:
                time.sleep(0.005)
                continue
            time.sleep(RUN_SECONDS)
            conn.execute("SELECT runrow.finish_run(%s, %s, 'completed')", row)


def one_round(url: str, big: int, fifo: bool) -> dict[str, list[float]]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT runrow.stop_conversation(c.id) FROM (SELECT DISTINCT conversation_id AS id"
            " FROM runrow.agent_run WHERE status IN ('queued', 'running', 'waiting')) AS c"
        )
        conn.execute("TRUNCATE runrow.fairness_tenant")
        first = conn.execute("SELECT coalesce(max(enqueue_seq), 0) FROM runrow.agent_run").fetchone()[0]
        tenants = (["A"] if big else []) + TENANTS
        for tenant in tenants:
            conn.execute(
                "SELECT runrow.enqueue_run(gen_random_uuid(), '\"x\"', 'bench', user_id => %s,"
                " fairness_key => %s) FROM generate_series(1, %s)",
                (tenant, "all" if fifo else tenant, big if tenant == "A" else SMALL),
            )
        stop = threading.Event()
        threads = [threading.Thread(target=worker, args=(url, f"w{n}", stop)) for n in range(WORKERS)]
        for t in threads:
            t.start()
        try:
            while conn.execute(
                "SELECT count(*) FROM runrow.agent_run WHERE enqueue_seq > %s AND user_id <> 'A'"
                " AND started_at IS NULL",
                (first,),
            ).fetchone()[0]:
                time.sleep(0.05)
        finally:
            stop.set()
            for t in threads:
                t.join()
        rows = conn.execute(
            "SELECT user_id, extract(epoch FROM started_at - created_at) FROM runrow.agent_run"
            " WHERE enqueue_seq > %s AND started_at IS NOT NULL",
            (first,),
        ).fetchall()
    waits: dict[str, list[float]] = {}
    for tenant, wait in rows:
        waits.setdefault(tenant, []).append(float(wait))
    return waits


def line(label: str, waits: dict[str, list[float]]) -> str:
    small = [w for t in TENANTS for w in waits.get(t, [])]
    parts = [
        f"  {label:<5} B..E p50 {percentile(small, 50) * 1000:8.0f} ms"
        f"  p99 {percentile(small, 99) * 1000:8.0f} ms"
    ]
    if "A" in waits:
        a = waits["A"]
        parts.append(f"| A claimed {len(a):>5} meanwhile, p50 {percentile(a, 50) * 1000:6.0f} ms")
    return " ".join(parts)


async def bench(url: str, short: bool = False) -> list[str]:
    big = 1_000 if short else 10_000
    fair = one_round(url, big, fifo=False)
    fifo = one_round(url, big, fifo=True)
    alone = one_round(url, 0, fifo=False)
    small_p99 = {
        k: percentile([w for t in TENANTS for w in r.get(t, [])], 99)
        for k, r in (("fair", fair), ("alone", alone))
    }
    return [
        f"fairness: A enqueues {big:,} runs, then B..E {SMALL} each; {WORKERS} workers,"
        f" {RUN_SECONDS * 1000:.0f} ms runs; wait = enqueue to claim",
        line("fair", fair),
        line("fifo", fifo),
        line("alone", alone),
        f"  B..E p99 fair / alone: {small_p99['fair'] / small_p99['alone']:.2f}x (goal: at most 2x)",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = cli(
        "bench.fairness",
        "Fair claiming: tenant A enqueues a backlog, then four other tenants a few runs each; how "
        "long the small tenants wait with fair claiming, first-in-first-out, and alone.",
    )
    parser.add_argument("--short", action="store_true", help="A's backlog is 1,000 runs instead of 10,000")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    run_alone("fairness", lambda url: bench(url, args.short))


if __name__ == "__main__":
    main()
