"""bench/wal_history.py at a small size, run as a reader of the README runs it: for runrow and
PgQueuer, a history drained through each system's own calls, then a counted drain right after a
CHECKPOINT on a cluster with full_page_writes on, every job checked done once. WAL is counted,
not timed; these sizes only show the harness works (make bench runs 1,000 and 1,000,000)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_each_system_is_counted_with_each_history(tmp_path: Path) -> None:
    out = tmp_path / "wal.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.wal_history",
            "--history",
            "20",
            "300",
            "--jobs",
            "200",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    shapes = {(r["system"].split(" ")[0], r["batch"], r["history"]) for r in rows}
    # One database per system and history: batch 1's jobs are in batch 10's history.
    assert shapes == {
        (system, batch, history)
        for system in ("runrow", "PgQueuer")
        for batch, history in ((1, 20), (10, 220), (1, 300), (10, 500))
    }
    for row in rows:
        assert row["jobs"] == 200 and row["wal_bytes"] > 0 and row["wal_records"] > 0, row
        # full_page_writes is on (bench.drain's cluster has it off): pages first changed after
        # the CHECKPOINT are logged whole.
        assert row["wal_fpi"] > 0, row
        # By relation, read back from the WAL: each system's images are of its own tables.
        assert sum(row["fpi_by_relation"].values()) <= row["wal_fpi"], row
        own = "agent_run" if row["system"].startswith("runrow") else "pgqueuer"
        assert own in row["fpi_by_relation"], row
    for line in (
        "runrow / PgQueuer, WAL bytes per job",
        "batch 10,       500 done before:",
        "runrow SQL API, batch 1: 300 done before / 20:",
        "PgQueuer 1.6, batch 10: 500 done before / 220:",
        "full-page images per job: agent_run",
        "(full_page_writes on, wal_compression off; runrow's conversation ids random)",
    ):
        assert line in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--history", "0"], "--history needs N >= 1"),
        (["--jobs", "0"], "--jobs must be at least 1"),
        (["--batch", "0"], "--batch sizes must be between 1 and 1000"),
        (["--wal-compression", "zip"], "invalid choice: 'zip'"),
        (["--conversation-ids", "v9"], "invalid choice: 'v9'"),
        (["--request-chars", "-1"], "--request-chars must be between 0 and 1000000"),
    ],
)
def test_bad_sizes_are_refused_before_anything_starts(args: list[str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.wal_history", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and says in done.stderr, done.stderr


def test_a_request_of_n_characters_is_what_each_system_carries(
    scratch_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--request-chars: runrow's user message and PgQueuer's payload are the same size, so the
    two drains compare like with like."""
    import psycopg

    monkeypatch.syspath_prepend(str(ROOT))  # bench/ is the repository's, not the package's
    from bench.wal_history import PGQUEUER, RUNROW, systems

    calls = systems(time_ordered=True, request_chars=1000)
    calls[RUNROW].install(scratch_database, 3)
    calls[PGQUEUER].install(scratch_database, 3)
    with psycopg.connect(scratch_database) as conn:
        sizes = conn.execute(
            "SELECT length(q.snapshot ->> 'content'), length(m.content #>> '{}')"
            " FROM runrow.run_request AS q JOIN runrow.agent_run AS a ON a.id = q.run_id"
            " JOIN runrow.message AS m ON m.id = a.user_message_id"
        ).fetchall()
        assert sizes == [(1000, 1000)] * 3, sizes
        payloads = conn.execute("SELECT length(payload) FROM pgqueuer").fetchall()
        assert payloads == [(1000,)] * 3, payloads


def test_a_checkpoint_during_the_drain_does_not_lose_the_wal_it_reads(
    database_url: str, superuser_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint between the drain and the read-back (as checkpoint_timeout brings during a
    slow drain) recycles the segments from the measured start unless something keeps them:
    before the temporary slot, `images_by_relation` failed with "requested WAL segment ... has
    already been removed" (seen in a 1,000,000-run measurement on a loaded box)."""
    import psycopg

    monkeypatch.syspath_prepend(str(ROOT))  # bench/ is the repository's, not the package's
    from bench import wal_history

    real_drain = wal_history.drain

    def drain_then_checkpoints(*args: object, **kwargs: object) -> object:
        result = real_drain(*args, **kwargs)  # type: ignore[arg-type]
        with psycopg.connect(superuser_url, autocommit=True) as su:
            for _ in range(3):
                su.execute("SELECT pg_switch_wal()")
                su.execute("CHECKPOINT")
        return result

    monkeypatch.setattr(wal_history, "drain", drain_then_checkpoints)
    rows = wal_history.measure(
        database_url,
        superuser_url,
        wal_history.RUNROW,
        wal_history.systems(time_ordered=True)[wal_history.RUNROW],
        [10],
        20,
        50,
        lambda _: None,
    )
    # The read-back went through (the test cluster runs without full-page images: none to count).
    assert [(r.batch, r.jobs, r.fpi_by_relation) for r in rows] == [(10, 50, {})], rows
    with psycopg.connect(superuser_url) as su:
        left = su.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'runrow_bench_wal%%'"
        )
        assert left.fetchall() == [], "the measurement's slot outlived it"
