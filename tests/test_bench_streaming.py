"""bench/streaming.py at a small size, run as a reader of the README runs it: a real `runrow
worker` streaming echo runs on a cluster of the benchmark's own, as shipped and with its
cross-run append batching switched off, each drain checked by the benchmark (every run completed
once, audit() clean). The counts come from the database (pg_stat_user_functions), so the
shipped worker's flushes must show up as append_runs_events calls, far fewer than the
append_events calls of the same runs sent one per run; the figures of `make bench` are 60 runs
at --concurrency 20."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_shipped_worker_batches_what_the_per_run_worker_sends_one_by_one(tmp_path: Path) -> None:
    out = tmp_path / "streaming.json"
    done = subprocess.run(
        [
            *[sys.executable, "-m", "bench.streaming", "--runs", "12", "--concurrency", "6"],
            *["--duration", "1", "--json", str(out)],
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    batched, per_run = json.loads(out.read_text())
    assert batched["system"] == "runrow worker" and per_run["system"].endswith("one append_events per run")
    for row in (batched, per_run):
        assert row["runs"] == 12 and row["deltas"] > 0, row
        assert row["calls"]["finish_runs"] + row["calls"]["finish_and_claim_runs"] > 0, row
    # Six runs streaming in step: most flushes carry deltas of three runs or more.
    assert batched["calls"]["append_runs_events"] > 0, batched
    assert per_run["calls"]["append_runs_events"] == 0, per_run
    assert per_run["calls"]["append_events"] >= 2 * batched["appends"], (batched, per_run)
    assert "batched / per run: journal calls" in done.stdout, done.stdout


def test_bad_sizes_are_refused_before_anything_starts() -> None:
    for args, says in (
        (["--runs", "0"], "--runs must be at least 1"),
        (["--concurrency", "0"], "--concurrency must be 1 to 1000"),
        (["--duration", "0"], "--duration must be 0.05 to 600 seconds"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "bench.streaming", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and says in done.stderr, done.stderr
