"""The cyclic garbage collector's thresholds for a long-running `runrow` process.

CPython collects its youngest generation every 700 net allocations of container objects. A
busy worker keeps more young objects than that alive at any moment (each run's tasks,
coroutines, frames and rows), so those collections come several times a second, find almost
nothing and walk everything young. Counted in a drain of zero-length runs at `--concurrency 10`
(2 processes, 2,500 runs each): 230 young and 21 middle collections per process, with one full
collection of 130-190 ms, 17-23% of the worker's CPU after startup. With the youngest threshold
at 10,000 that drain makes none. Cyclic garbage is still collected, only later: at most
10,000 young objects' worth of it waits for the next collection. `tests/test_collector.py`
counts the collections through the worker's `python_gc_collections_total` metric. Only the
CLI's processes call this: a program that embeds pyworker owns its own interpreter's settings.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000


def tune_collector() -> None:
    """Collect the youngest generation every YOUNG_THRESHOLD net allocations, not every 700."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
