"""bench/instructions.py at a small size, run as a reader of the README runs it: the postmaster
restarted under callgrind, each drain checked to end every run once, and the figure a difference
of two sessions' counts. Instructions do not depend on the clock, so the one property asserted
holds on any box: per run, a call that ends and claims five runs costs less than five calls of
one (the call's fixed work is shared). PgQueuer is counted beside it, in the same cluster, and the
ratios printed; so is each system's split into a call's shared work and each run's own."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

needs_valgrind = pytest.mark.skipif(
    shutil.which("valgrind") is None, reason="valgrind is not installed (make test installs it)"
)


@needs_valgrind
def test_instruction_counts_per_run_show_what_batching_shares(tmp_path: Path) -> None:
    out, keep = tmp_path / "instructions.json", tmp_path / "callgrind"
    done = subprocess.run(
        [
            *[sys.executable, "-m", "bench.instructions", "--batch", "1", "5", "--events", "0"],
            *["--small", "10", "--large", "30", "--keep", str(keep), "--json", str(out)],
            *["--by-function", "3"],
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    one, five = figures["batch 1, 0 events"], figures["batch 5, 0 events"]
    # A run's work is hundreds of thousands of instructions, a call's millions.
    assert 100_000 < five < one < 50_000_000, done.stdout
    assert "batch 5, 0 events per ending:" in done.stdout
    # PgQueuer's drains were counted and checked (every job logged once); at 10 and 30 jobs a
    # stray timed flush weighs too much for its figure to mean more than "counted".
    for batch in (1, 5):
        assert figures[f"PgQueuer, batch {batch}"] > 10_000, done.stdout
        ratio = figures[f"batch {batch}, 0 events"] / figures[f"PgQueuer, batch {batch}"]
        assert figures[f"runrow/PgQueuer, batch {batch}"] == pytest.approx(ratio)
        assert f"runrow/PgQueuer, batch {batch}:" in done.stdout and f"{ratio:.2f}x" in done.stdout
    # The split goes to the JSON too, as make bench keeps it.
    assert figures["per run, runrow, 0 events"] == pytest.approx(one - (one - five) / (1 - 1 / 5))
    for line in (
        "per call, runrow, 0 events:",
        "per run, runrow, 0 events:",
        "per call, PgQueuer:",
        "per run, PgQueuer:",
        "runrow/PgQueuer, per run:",
    ):
        assert line in done.stdout, done.stdout
    # --by-function read those files: three functions by each measure, for runrow and the peer,
    # the executor's start-up among a call's shared work (plans are cached, executor state is not).
    tables = done.stdout.split("inclusive instructions by function")
    assert len(tables) == 3, done.stdout
    assert "=== runrow, 0 events: " in tables[0] and "=== PgQueuer: " in tables[1], done.stdout
    for table in tables[1:]:
        rows = [line for line in table.splitlines() if line.startswith("    ")]
        assert len(rows) == 6, table
        assert all(re.fullmatch(r"    \S.* +-?[\d,]+ +-?[\d,]+", row) for row in rows), table
    assert "(below main)" not in done.stdout and "'2" not in done.stdout
    assert sorted(p.name for p in keep.iterdir()) == [
        "batch1-events0-runs10.callgrind",
        "batch1-events0-runs30.callgrind",
        "batch5-events0-runs10.callgrind",
        "batch5-events0-runs30.callgrind",
        "pgqueuer-batch1-jobs10.callgrind",
        "pgqueuer-batch1-jobs30.callgrind",
        "pgqueuer-batch5-jobs10.callgrind",
        "pgqueuer-batch5-jobs30.callgrind",
    ]


def test_a_figure_per_run_splits_into_a_calls_work_over_its_batch_and_a_runs_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """per run at batch b = per_run + per_call / b: two batch sizes give both, for each shape,
    and the ratios compare runrow without events with PgQueuer."""
    monkeypatch.syspath_prepend(str(ROOT))  # bench/ is the repository's, not the package's
    from bench.instructions import fixed_and_per_run, report

    runrow = {1: 2_000_000 + 500_000, 10: 200_000 + 500_000}  # per call 2 M, per run 500 k
    peer = {1: 3_000_000 + 200_000, 10: 300_000 + 200_000}  # per call 3 M, per run 200 k
    figures = {f"batch {b}, 0 events": v for b, v in runrow.items()}
    figures |= {f"batch {b}, 2 events": v + 150_000 for b, v in runrow.items()}
    figures |= {f"PgQueuer, batch {b}": v for b, v in peer.items()}
    figures |= {f"runrow/PgQueuer, batch {b}": runrow[b] / peer[b] for b in (1, 10)}
    split = fixed_and_per_run(figures)
    assert split == pytest.approx(
        {
            "per call, runrow, 0 events": 2_000_000,
            "per run, runrow, 0 events": 500_000,
            "per call, runrow, 2 events": 2_000_000,
            "per run, runrow, 2 events": 650_000,
            "per call, PgQueuer": 3_000_000,
            "per run, PgQueuer": 200_000,
            "runrow/PgQueuer, per call": 2 / 3,
            "runrow/PgQueuer, per run": 2.5,
        }
    )
    assert "  runrow/PgQueuer, per run:           2.50x" in report(figures)
    # The figures as --json writes them, split included, split the same.
    assert fixed_and_per_run(figures | split) == split
    # One batch size: nothing to split.
    assert fixed_and_per_run({"batch 10, 0 events": 700_000.0}) == {}


def test_by_function_reads_callgrind_annotate_and_splits_each_function_like_the_totals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A function's per-run figure is the difference of two drains over their runs, split as the
    totals are; unnamed addresses, recursion levels and the frames every backend passes through
    are not functions to read."""
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.by_function import parse_annotate, per_run, report, split

    annotate = """\
--------------------------------------------------------------------------------
Ir                      file:function
--------------------------------------------------------------------------------
558,501,210 (100.0%)  PROGRAM TOTALS
538,444,083 (96.41%)  ???:(below main) [/usr/lib/postgresql/15/bin/postgres]
518,052,849 (92.76%)  ???:PostgresMain [/usr/lib/postgresql/15/bin/postgres]
 75,212,655 (13.47%)  ???:ExecutorStart [/usr/lib/postgresql/15/bin/postgres]
910,387,320 (163.0%)  ???:0x00000000000150d0'2 [/usr/lib/postgresql/15/lib/plpgsql.so]
791,166,594 (141.7%)  ???:ExecScan'2 [/usr/lib/postgresql/15/bin/postgres]
 50,008,542 ( 8.95%)  ???:ExecBRInsertTriggers [/usr/lib/postgresql/15/bin/postgres]
 10,724,735 ( 1.92%)  ./string/memset.S:__memset_avx2_unaligned_erms [/usr/lib/x86_64-linux-gnu/libc.so.6]
"""
    assert parse_annotate(annotate) == {
        "ExecutorStart": 75_212_655,
        "ExecBRInsertTriggers": 50_008_542,
        "__memset_avx2_unaligned_erms": 10_724_735,
    }
    # Drains of 200 and 600 runs: per run is the difference over 400; a function seen in one
    # drain only counts from zero in the other.
    assert per_run({"a": 1_000, "b": 400}, {"a": 5_000, "c": 800}, 400) == {"a": 10.0, "b": -1.0, "c": 2.0}
    # ExecutorStart: 2 M per call, 30 k per run; the journal guard: nothing per call, 80 k per run.
    by_batch = {
        1: {"ExecutorStart": 2_030_000.0, "ExecBRInsertTriggers": 80_000.0},
        10: {"ExecutorStart": 230_000.0, "ExecBRInsertTriggers": 80_000.0},
    }
    parts = split(by_batch)
    assert parts["ExecutorStart"] == pytest.approx((2_000_000, 30_000))
    assert parts["ExecBRInsertTriggers"] == pytest.approx((0, 80_000))
    lines = report("runrow, 0 events", parts, 1)
    assert lines[1].startswith("  by per call:")
    assert lines[2].split() == ["ExecutorStart", "2,000,000", "30,000"]
    assert lines[3].startswith("  by per run:")
    assert lines[4].split() == ["ExecBRInsertTriggers", "0", "80,000"]
