"""The drain benchmark's harness, small: every system's row drains its jobs and passes the
checks inside the benchmark (every job done exactly once; for runrow, every run completed
once and claimed once, audit() clean), the report has its ratios, and the JSON its rows.
Speed is not asserted: figures come from `make bench`, not from a test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_a_small_drain_of_every_system_passes_its_own_checks(tmp_path: Path):
    out = tmp_path / "drain.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "RUNROW_SUPERUSER_URL")}
    result = subprocess.run(
        [sys.executable, "-m", "bench.drain", "--jobs", "200"],
        capture_output=True,
        text=True,
        env={**env, "RUNROW_BENCH_JSON": str(out)},
        cwd=REPO,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())["rows"]
    systems = {(r["system"], r["batch"]) for r in rows}
    for batch in (1, 10):
        for system in (
            "bare SQL (claim UPDATE, ack DELETE)",
            "PgQueuer 1.6 (asyncpg, QueueManager)",
            "PgQueuer 1.6 (psycopg, QueueManager)",
            "runrow SQL API (claim_runs -> finish_runs)",
            "runrow SQL API (finish_runs + next claim_runs)",
            "runrow SQL API (finish_and_claim_runs)",
            "runrow floor (narrow table)",
            "runrow floor (its tables, no triggers)",
            "runrow floor (its tables and triggers)",
            "runrow floor (its functions, no rule triggers)",
            f"runrow worker (--concurrency {batch})",
        ):
            assert (system, batch) in systems
    assert all(
        r["jobs"] == 200 and r["commits"] > 0 and r["wal_bytes"] > 0 and r["buffers"] > 0 for r in rows
    )
    # The private cluster runs on this host: every row splits its CPU into client and server.
    assert all(r["client_cpu"] is not None and r["server_cpu"] > 0 for r in rows), rows
    assert "x CPU/job" in result.stdout
    assert "runrow SQL API / PgQueuer 1.6 (asyncpg)" in result.stdout
    assert "runrow SQL API chained / PgQueuer 1.6 (asyncpg)" in result.stdout
    assert "runrow SQL API one call / PgQueuer 1.6 (asyncpg)" in result.stdout
    assert "runrow floor, its tables and triggers / PgQueuer 1.6 (asyncpg)" in result.stdout
    assert "runrow floor, its functions without rule triggers / PgQueuer 1.6 (asyncpg)" in result.stdout
    # Chained, a batch's finish rides the next claim's transaction: about one commit per
    # batch, not two (counted by pg_stat_database, not timed).
    by = {(r["system"], r["batch"]): r for r in rows}
    for batch in (1, 10):
        plain = by[("runrow SQL API (claim_runs -> finish_runs)", batch)]["commits"]
        chained = by[("runrow SQL API (finish_runs + next claim_runs)", batch)]["commits"]
        one_call = by[("runrow SQL API (finish_and_claim_runs)", batch)]["commits"]
        assert chained < 0.75 * plain, (batch, plain, chained)
        assert one_call < 0.75 * plain, (batch, plain, one_call)


def test_ratios_over_rounds_are_the_median_of_each_rounds_own_ratio(monkeypatch):
    """Each round's runrow row is divided by that round's faster PgQueuer row, and the report
    quotes the median of those ratios with their range; a slow round of the box moves every
    system of that round, not the quoted figure."""
    monkeypatch.syspath_prepend(str(REPO))  # bench/ is the repository's, not the package's
    from bench import drain

    def row(system: str, rate: float, n: int) -> drain.Row:
        return drain.Row(
            system, 10, 1000, 1000 / rate, wal_bytes=1000, wal_records=10, wal_fpi=0, commits=100, round=n
        )

    rows = []
    # Round 2 is a slow spell: every system runs at half speed.
    for n, (pgq, api) in enumerate([(1000, 1300), (500, 550), (1000, 1200)], start=1):
        rows += [
            row("bare SQL (claim UPDATE, ack DELETE)", 3000, n),
            row("PgQueuer 1.6 (asyncpg, QueueManager)", pgq, n),
            row("PgQueuer 1.6 (psycopg, QueueManager)", pgq * 0.9, n),
            row(drain.RUNROW_API, api, n),
        ]
    lines = drain.report(rows, 1000)
    assert lines[0].endswith("3 rounds")
    (ratio,) = [line for line in lines if "runrow SQL API / PgQueuer" in line]
    assert "1.20x jobs/s (median of 3 rounds, 1.10-1.30x)" in ratio, ratio
    # A short drain says its ratios flatter runrow (PgQueuer's fixed start-up); a full one does not.
    assert any("these ratios flatter runrow" in line for line in lines)
    assert not any("flatter" in line for line in drain.report(rows, drain.JOBS))


def test_a_process_trees_cpu_counts_its_children_live_and_exited(monkeypatch):
    """bench/cpu.py reads a postmaster's whole cluster as its tree: a backend's CPU must count
    while it runs and still after it has exited and been reaped (the drain's processes are gone
    by the time their row is read)."""
    monkeypatch.syspath_prepend(str(REPO))
    from bench import cpu

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    me = os.getpid()
    before = cpu.tree_seconds(me)
    wait = "import sys; sys.stdin.read()"
    live = subprocess.Popen([sys.executable, "-c", burn + wait], stdin=subprocess.PIPE)
    try:
        # /proc counts in ticks (10 ms): 0.25, not the 0.3 the child burns, is surely reached.
        deadline = time.monotonic() + 60
        while (cpu.process_seconds(live.pid) or 0) < 0.25:
            assert live.poll() is None and time.monotonic() < deadline, "the burning child did not burn"
            time.sleep(0.05)
        while_live = cpu.tree_seconds(me)
    finally:
        live.communicate(b"")
    subprocess.run([sys.executable, "-c", burn], check=True)
    after = cpu.tree_seconds(me)
    assert before is not None and while_live is not None and after is not None
    assert while_live - before >= 0.25
    assert after - before >= 0.55  # both children, reaped: in this process's cutime and cstime
