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

`--worker-time` asks the other question (migration 0076: fairness counts worker time, not
claims): 8 workers; tenant A enqueues 500 runs that hold a slot 5 s each, tenant B 3,000 runs of
0.05 s; how many runs B starts in the first 20 s (by the database clock), beside A and alone.
Counting claims, A held nearly every slot (B started 31, 2,863 alone); by worker time, B gets
about half the slot time.
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
        conn.execute("TRUNCATE runrow.fairness_tenant, runrow.fairness_charge")
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


TIME_WORKERS = 8
TIME_WINDOW = 20.0
TIME_RUNS = {"A": (500, 5.0), "B": (3_000, 0.05)}


def timed_worker(url: str, name: str, stop: threading.Event) -> None:
    """claim_run, hold the run as long as its tenant's runs take (by user_id), finish_run."""
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            row = conn.execute(
                "SELECT run_id, claim_token, user_id FROM runrow.claim_run(%s, 60)", (name,)
            ).fetchone()
            if row is None:
                time.sleep(0.005)
                continue
            time.sleep(TIME_RUNS[row[2]][1])
            conn.execute("SELECT runrow.finish_run(%s, %s, 'completed')", row[:2])


def time_round(url: str, tenants: list[str]) -> dict[str, int]:
    """Runs each tenant started in the first TIME_WINDOW seconds after its runs were enqueued."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT runrow.stop_conversation(c.id) FROM (SELECT DISTINCT conversation_id AS id"
            " FROM runrow.agent_run WHERE status IN ('queued', 'running', 'waiting')) AS c"
        )
        conn.execute("TRUNCATE runrow.fairness_tenant, runrow.fairness_charge")
        first = conn.execute("SELECT coalesce(max(enqueue_seq), 0) FROM runrow.agent_run").fetchone()[0]
        for tenant in tenants:
            conn.execute(
                "SELECT runrow.enqueue_run(gen_random_uuid(), '\"x\"', 'bench', user_id => %s,"
                " fairness_key => %s) FROM generate_series(1, %s)",
                (tenant, tenant, TIME_RUNS[tenant][0]),
            )
        start = conn.execute("SELECT now()").fetchone()[0]
        stop = threading.Event()
        threads = [
            threading.Thread(target=timed_worker, args=(url, f"w{n}", stop)) for n in range(TIME_WORKERS)
        ]
        for t in threads:
            t.start()
        try:
            time.sleep(TIME_WINDOW + 0.5)
        finally:
            stop.set()
            for t in threads:
                t.join()
        rows = conn.execute(
            "SELECT user_id, count(*) FROM runrow.agent_run WHERE enqueue_seq > %s"
            " AND started_at < %s + make_interval(secs => %s) GROUP BY user_id",
            (first, start, TIME_WINDOW),
        ).fetchall()
    return {tenant: int(n) for tenant, n in rows}


async def worker_time_bench(url: str) -> list[str]:
    beside = time_round(url, ["A", "B"])
    alone = time_round(url, ["B"])
    return [
        f"fairness by worker time: {TIME_WORKERS} workers; A {TIME_RUNS['A'][0]:,} runs of"
        f" {TIME_RUNS['A'][1]:g} s, B {TIME_RUNS['B'][0]:,} of {TIME_RUNS['B'][1]:g} s;"
        f" runs started in the first {TIME_WINDOW:g} s",
        f"  beside A: B started {beside.get('B', 0):>5}, A {beside.get('A', 0):>4}",
        f"  alone:    B started {alone.get('B', 0):>5}",
    ]


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
    parser.add_argument(
        "--worker-time",
        action="store_true",
        help="a tenant of 5 s runs beside one of 0.05 s runs: runs each starts in 20 s (about 45 s)",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker_time:
        run_alone("fairness", worker_time_bench)
    else:
        run_alone("fairness", lambda url: bench(url, args.short))


if __name__ == "__main__":
    main()
