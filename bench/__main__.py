"""Run every benchmark and print one report: `make bench`, or `python -m bench` with DATABASE_URL.

Each benchmark is also runnable alone: `python -m bench.enqueue_to_claim`,
`python -m bench.stop_to_cancelled`, `python -m bench.journal_rows`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from bench import enqueue_to_claim, journal_rows, stop_to_cancelled
from bench.common import bench_database, machine

BENCHMARKS: list[tuple[str, Callable[[str], Awaitable[list[str]]]]] = [
    ("claim", enqueue_to_claim.bench),
    ("stop", stop_to_cancelled.bench),
    ("journal", journal_rows.bench),
]


def main() -> None:
    started = time.monotonic()
    report: list[str] = []
    for name, bench in BENCHMARKS:
        t0 = time.monotonic()
        with bench_database(name) as url:
            lines = asyncio.run(bench(url))
            if not report:
                report.append(machine(url))
        lines[0] += f"  [{time.monotonic() - t0:.0f} s]"
        report.extend(["", *lines])
        print("\n".join(lines), flush=True)
    print("\n=== runrow benchmarks ===")
    print("\n".join(report))
    print(f"\n(total {time.monotonic() - started:.0f} s; latencies on the database clock unless noted)")


if __name__ == "__main__":
    main()
