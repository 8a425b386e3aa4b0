"""Run every benchmark and print one report: `make bench`, or `python -m bench` with DATABASE_URL.

Each benchmark is also runnable alone: `python -m bench.enqueue_to_claim`,
`python -m bench.stop_to_cancelled`, `python -m bench.journal_rows`,
`python -m bench.claim_buffers`, `python -m bench.prompt_cache`, `python -m bench.fairness`,
`python -m bench.rate_limits`, `python -m bench.trim`,
`python -m bench.drain`, `python -m bench.instructions`, `python -m bench.api_calls`,
`python -m bench.client_instructions`, `python -m bench.wal_history`, `python -m bench.streaming`.
The drain runs on a cluster of its own with fsync on, then WAL per job with a history (1,000 and
1,000,000 jobs done before; `--short`: 100,000) on one with full_page_writes on too, then a
streaming worker's journal calls with and without its cross-run batching on one more; the
instruction counts last (per run of the drain, then per call of the functions a running agent
calls, on one under callgrind; then the client processes' own, `runrow worker` against PgQueuer's,
each under callgrind; skipped without valgrind). `--short`:
smaller sizes for the buffer counts, the fairness backlog, the trim and the drain; `--rounds N`:
the drain's rounds (default 3; ratios are the median of the rounds). The report,
the trim's figures and the drain's rows go to bench-results.json (RUNROW_BENCH_JSON to change
it).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable

from bench import (
    api_calls,
    claim_buffers,
    client_instructions,
    drain,
    enqueue_to_claim,
    fairness,
    instructions,
    journal_rows,
    prompt_cache,
    rate_limits,
    stop_to_cancelled,
    streaming,
    trim,
    wal_history,
)
from bench.common import bench_database, cli, machine

FIGURES: dict[str, object] = {}


def benchmarks(short: bool) -> list[tuple[str, Callable[[str], Awaitable[list[str]]]]]:
    async def trim_bench(url: str) -> list[str]:
        lines, FIGURES["trim"] = trim.run(url, trim.SHORT if short else trim.FULL)
        return lines

    return [
        ("claim", enqueue_to_claim.bench),
        ("stop", stop_to_cancelled.bench),
        ("journal", journal_rows.bench),
        ("claim_buffers", lambda url: claim_buffers.bench(url, short)),
        ("prompt_cache", prompt_cache.bench),
        ("fairness", lambda url: fairness.bench(url, short)),
        ("rate_limits", rate_limits.bench),
        ("trim", trim_bench),
    ]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = cli(
        "bench",
        "Run every benchmark and print one report (what `make bench` runs: about two hours on 2 "
        "cores, plus the trim's; --short for a quick pass).",
        "The latency, buffer, fairness and trim benchmarks run in databases of their own on the "
        "server DATABASE_URL points to (`make bench` gives them a throwaway cluster); the drain, "
        "the WAL history, the streaming counts and the instruction counts start clusters of their "
        "own. Each is runnable alone as `python -m bench.<name>`.",
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help="smaller sizes: the buffer counts, the fairness backlog, the trim, the drain, the WAL history",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        metavar="N",
        help="the drain's rounds, alternating systems; each ratio is the median of the rounds (default 3)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    report: list[str] = []
    for name, bench in benchmarks(args.short):
        t0 = time.monotonic()
        with bench_database(name) as url:
            lines = asyncio.run(bench(url))
            if not report:
                report.append(machine(url))
        lines[0] += f"  [{time.monotonic() - t0:.0f} s]"
        report.extend(["", *lines])
        print("\n".join(lines), flush=True)
    t0 = time.monotonic()
    lines, rows = drain.run(args.short, rounds=args.rounds)
    lines[0] += f"  [{time.monotonic() - t0:.0f} s]"
    report.extend(["", *lines])
    t0 = time.monotonic()
    histories = [1_000, 100_000 if args.short else 1_000_000]
    lines, wal_rows = wal_history.run(histories, wal_history.JOBS, list(wal_history.BATCHES), with_peer=True)
    FIGURES["wal_history"] = [dataclasses.asdict(r) for r in wal_rows]
    lines[0] += f"  [{time.monotonic() - t0:.0f} s]"
    report.extend(["", *lines])
    print("\n".join(lines), flush=True)
    t0 = time.monotonic()
    lines, stream_rows = streaming.run(streaming.RUNS, streaming.CONCURRENCY, streaming.DURATION)
    FIGURES["streaming"] = [dataclasses.asdict(r) for r in stream_rows]
    lines[0] += f"  [{time.monotonic() - t0:.0f} s]"
    report.extend(["", *lines])
    print("\n".join(lines), flush=True)
    if shutil.which("valgrind") is None:
        report.extend(["", "(backend instructions per run not counted: valgrind is not installed)"])
    else:
        t0 = time.monotonic()
        FIGURES["instructions_per_run"] = counted = instructions.count([1, 10], [0, 2])
        FIGURES["instructions_per_call_and_per_run"] = instructions.fixed_and_per_run(counted)
        lines = instructions.report(counted)
        lines[0] += f"  [{time.monotonic() - t0:.0f} s]"
        report.extend(["", *lines])
        print("\n".join(lines), flush=True)
        t0 = time.monotonic()
        FIGURES["instructions_per_api_call"] = per_call = api_calls.count(list(api_calls.SHAPES))
        lines = api_calls.report(per_call)
        lines[0] += f"  [{time.monotonic() - t0:.0f} s]"
        report.extend(["", *lines])
        print("\n".join(lines), flush=True)
        t0 = time.monotonic()
        FIGURES["client_instructions_per_run"] = per_client = client_instructions.count([1, 10], 300, 900)
        lines = client_instructions.report(per_client)
        lines[0] += f"  [{time.monotonic() - t0:.0f} s]"
        report.extend(["", *lines])
        print("\n".join(lines), flush=True)
    print("\n=== runrow benchmarks ===")
    print("\n".join(report))
    out = os.environ.get("RUNROW_BENCH_JSON", "bench-results.json")
    with open(out, "w") as f:
        json.dump({"report": report, **FIGURES, "drain": rows}, f, indent=2)
    print(f"(report, trim figures and drain rows in {out})")
    print(f"\n(total {time.monotonic() - started:.0f} s; latencies on the database clock unless noted)")


if __name__ == "__main__":
    main()
