"""Where a run's backend instructions go, by PostgreSQL C function: `bench.instructions
--by-function N` reads the callgrind files of its drains and splits each function's inclusive
count into a call's shared work and each run's own, as it splits the totals.

Why by C function and not by SQL statement: pg_stat_statements times a nested statement's run
but not its executor start-up, which is where much of a call's fixed work goes (plans are cached;
executor state is built again on every execution), and time on a shared 2-core box moves more
than the changes worth measuring. A function's inclusive count includes its callees' (so
ExecutorStart includes ExecInitNode), and a function reached from many statements sums them
all: read the table as "how much of the work passes through here", not as parts that add up.
Unnamed addresses (static functions of a stripped binary) and callgrind's recursion levels
(`name'2`, already inside `name`) are left out.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

# "1,234,567 (12.34%)  ???:ExecutorStart [/usr/lib/postgresql/15/bin/postgres]"
_LINE = re.compile(r"\s*(?P<count>[\d,]+)\s+(?:\([^)]*\)\s+)?[^:\s]*:(?P<name>.+?)(?: \[.*\])?$")
# The frames every backend's work passes through: they say nothing about where it goes.
_FRAMES = {
    "(below main)",
    "main",
    "__libc_start_main@@GLIBC_2.34",
    "PostmasterMain",
    "PostgresMain",
    "PortalRun",
    "ExecutorRun",
    "standard_ExecutorRun",
}


def parse_annotate(text: str) -> dict[str, int]:
    """Inclusive instructions by function name from `callgrind_annotate --inclusive=yes` output,
    without unnamed addresses, recursion levels and the frames every backend passes through."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        name = m["name"]
        if name.startswith("0x") or "'" in name or name in _FRAMES:
            continue
        counts[name] = counts.get(name, 0) + int(m["count"].replace(",", ""))
    return counts


def inclusive(path: Path) -> dict[str, int]:
    """Inclusive instructions by function of one callgrind file (every function listed)."""
    done = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return parse_annotate(done.stdout)


def per_run(small: Mapping[str, int], large: Mapping[str, int], runs: int) -> dict[str, float]:
    """Each function's instructions per run: the difference of two drains over their difference
    of runs, so a session's start-up (its connection, its first plans) cancels out."""
    return {name: (large.get(name, 0) - small.get(name, 0)) / runs for name in set(small) | set(large)}


def split(by_batch: Mapping[int, Mapping[str, float]]) -> dict[str, tuple[float, float]]:
    """(per call, per run) of each function, from its per-run figure at the smallest and the
    largest batch: figure at batch b = per run + per call / b, as bench.instructions splits the
    totals."""
    low, high = min(by_batch), max(by_batch)
    names = set(by_batch[low]) | set(by_batch[high])
    parts: dict[str, tuple[float, float]] = {}
    for name in names:
        at_low, at_high = by_batch[low].get(name, 0.0), by_batch[high].get(name, 0.0)
        per_call = (at_low - at_high) / (1 / low - 1 / high)
        parts[name] = (per_call, at_low - per_call / low)
    return parts


def report(title: str, parts: Mapping[str, tuple[float, float]], top: int) -> list[str]:
    """The top functions by per-call work, then the top by per-run work."""
    lines = [f"=== {title}: inclusive instructions by function (each includes its callees') ==="]
    for column, label in ((0, "per call"), (1, "per run")):
        lines.append(f"  {'by ' + label + ':':<36} {'per call':>12} {'per run':>12}")
        ranked = sorted(parts.items(), key=lambda item: item[1][column], reverse=True)[:top]
        lines += [f"    {name:<34} {call:>12,.0f} {run:>12,.0f}" for name, (call, run) in ranked]
    return lines
