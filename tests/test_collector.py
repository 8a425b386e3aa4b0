"""`runrow worker` does not run the garbage collector's youngest generation several times a second
(pyworker/worker/collector.py). Counted, not timed: the worker's own
`python_gc_collections_total{generation="0"}` over a drain of zero-length runs at
`--concurrency 10`. At CPython's default threshold (700) this drain makes a young collection
every dozen runs or so; at 10,000 a drain this size makes at most a few."""

from __future__ import annotations

import psycopg
from metrics_support import metrics_url, scrape, value
from worker_support import db, enqueue_echo, start_worker, wait_status, worker_db

__all__ = ["db", "start_worker", "worker_db"]

RUNS = 300


def test_a_drain_makes_next_to_no_young_collections(db: psycopg.Connection, start_worker) -> None:  # type: ignore[no-untyped-def]
    worker = start_worker("collector", "--metrics-port", "0", "--concurrency", "10", "--poll", "0.3")
    url = metrics_url(worker)
    young = value(scrape(url), "python_gc_collections_total", generation="0")
    runs = [enqueue_echo(db, "x", duration=0) for _ in range(RUNS)]
    for run in runs:
        assert wait_status(db, run, {"completed", "failed", "dead"}) == "completed"
    collections = value(scrape(url), "python_gc_collections_total", generation="0") - young
    assert collections <= RUNS / 100, f"{collections:.0f} young collections in {RUNS} runs"
