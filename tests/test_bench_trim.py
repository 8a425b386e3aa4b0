"""bench/trim.py at a small size, so its own checks stay true as the schema moves: every run
completed once, the trim deletes exactly the journals and nothing else (steps kept, a trimmed run
still reads as complete), audit() clean, and the two findings bench/RESULTS.md reports from it:
the space the trim frees is reused by the next runs' journals, and the claim and the finish read
no more buffers right after a trim than before it. Run as `python -m bench.trim`, the way a
reader of the README runs it."""

from __future__ import annotations

from pathlib import Path

from bench_support import run_bench

RUNS = 2_000
EVENTS_PER_RUN = 26  # bench.trim's journal: 2 from enqueue, run_claimed, 22 streamed, complete


def test_trim_bench_checks_itself(tmp_path: Path) -> None:
    # A cluster of its own (bench_support): whether the trimmed rows' index entries can be
    # skipped right after the trim depends on the oldest xid running anywhere in the cluster.
    report, figures = run_bench("trim", "--runs", str(RUNS), out=tmp_path / "trim.json")
    # Every bench run's journal, and the 4 rows (enqueue, claim, complete) of the probe run the
    # buffer counts claimed and finished before the trim.
    assert figures["deleted"] == RUNS * EVENTS_PER_RUN + 4, report
    heap, indexes = figures["second_fill_growth"]["run_event"]
    assert heap < 0.25 and indexes < 0.25, f"the 2nd fill did not reuse run_event's space:\n{report}"
    cost = figures["buffers"]
    for call in ("empty claim", "claim", "finish"):
        assert cost["after trim"][call] <= cost["before trim"][call], (
            f"{call} dearer after the trim:\n{report}"
        )
