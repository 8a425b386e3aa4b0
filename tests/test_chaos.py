"""The short chaos run of the test command: 4 real worker processes under seeded random SIGKILL,
SIGSTOP+SIGCONT and SIGTERM with restarts, 180 echo runs in 45 conversations of 4 turns, 2 s
leases. Every check of tests/chaos.py must hold (none lost, all terminal, one `complete` and it
is last, gap-free seqs, the final attempt's journal text is the result text, turn order, an empty
audit). `make chaos` runs the same harness for minutes."""

from __future__ import annotations

from chaos import Settings, run_chaos


def test_chaos_short(database_url: str) -> None:
    summary = run_chaos(database_url, Settings(duration=40, workers=4, runs=180, turns=4, seed=3, settle=90))
    print(summary.render())
    assert summary.runs == 180 and sum(summary.statuses.values()) == 180
    assert summary.faults["kill"] + summary.faults["stop"] + summary.faults["term"] > 0
    assert not summary.violations, summary.render()
