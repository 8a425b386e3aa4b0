"""bench/claim_buffers.py at its --short size (100 and 5,000 finished runs, 1,000 blocked turns,
1,000 runs ended since the last vacuum), so the figures bench/RESULTS.md quotes from it keep meaning
what they say as the schema moves: once vacuumed, a claim, a heartbeat, an append and a finish
read no more with the bigger history (issue 11 asks within 1.2x; a B-tree level more is a
buffer), and an empty claim over blocked turns reads about what an empty queue does. Counted in
buffers, not timed. Run as `python -m bench.claim_buffers`, the way a reader of the README runs
it."""

from __future__ import annotations

from pathlib import Path

from bench_support import run_bench


def test_the_lifecycle_reads_no_more_with_more_history_once_vacuumed(tmp_path: Path) -> None:
    # A cluster of its own (bench_support): what a VACUUM can drop, and so what a call reads
    # after it, depends on the oldest transaction open anywhere in the cluster.
    report, figures = run_bench("claim_buffers", "--short", out=tmp_path / "claim_buffers.json")
    few, many = figures["at few"], figures["at many"]
    for call in ("claim", "heartbeat", "append", "finish"):
        assert many[call] <= few[call] * 1.2 + 1, f"{call} reads more with more history:\n{report}"
    empty = figures["empty claim"]
    assert empty["vacuumed"] <= empty["no queued turn"] + 5, (
        f"an empty claim reads the blocked turns:\n{report}"
    )
