"""bench/api_calls.py: each call's session does what the call is for (and says so when it does
not), and at a small size, run as a reader of the README runs it, every call is counted under
callgrind with a figure in the range of a call's work."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from pyworker.db.devdb import temporary_database

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is the repository's own, not an installed package
    sys.path.insert(0, str(ROOT))
from bench import api_calls  # noqa: E402

needs_valgrind = pytest.mark.skipif(
    shutil.which("valgrind") is None, reason="valgrind is not installed (make test installs it)"
)


@pytest.mark.parametrize("name", list(api_calls.SHAPES))
def test_each_session_makes_calls_that_do_their_work(database_url: str, name: str) -> None:
    shape = api_calls.SHAPES[name]
    with temporary_database(database_url, "bench_calls", migrated=False) as url:
        runs = api_calls.prepare(url, shape, 3)
        if shape.setup is None:  # a shape that sets its calls up says what they need itself
            assert len(runs) == shape.runs(3)
        api_calls.session(url, shape, runs, 3)


@pytest.mark.parametrize(
    "name",
    [
        "heartbeat",
        "append_events",
        f"append_runs_events_x{api_calls.BATCH_RUNS}",
        "append_step",
        "acquire_model_call",
        "finish_run",
        "begin_tool_call",
        "complete_tool_call",
        "complete_webhook_delivery",
    ],
)
def test_a_session_fenced_out_fails_its_check(database_url: str, name: str) -> None:
    """The checks can fail: the same calls with another token write nothing, and the session
    says so instead of counting them."""
    shape = api_calls.SHAPES[name]
    with temporary_database(database_url, "bench_calls", migrated=False) as url:
        runs = [(p[0], uuid.uuid4(), *p[2:]) for p in api_calls.prepare(url, shape, 2)]
        with pytest.raises(AssertionError):
            api_calls.session(url, shape, runs, 2)


@needs_valgrind
def test_every_call_is_counted_under_callgrind(tmp_path: Path) -> None:
    out, kept = tmp_path / "calls.json", tmp_path / "kept"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.api_calls",
            "--small",
            "5",
            "--large",
            "15",
            "--json",
            str(out),
            "--keep",
            str(kept),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert set(figures) == set(api_calls.SHAPES)
    # A call is a transaction of a few statements: some hundred thousand instructions, not tens
    # of millions (a plan rebuilt per call, or a scan of the tables, would show here).
    for name, figure in figures.items():
        assert 50_000 < figure < 20_000_000, (name, figure)
        assert f"{name}:" in done.stdout
    # --keep: each session's callgrind file, as callgrind_annotate reads it.
    assert sorted(p.name for p in kept.iterdir()) == sorted(
        f"{name}-{n}.callgrind" for name in api_calls.SHAPES for n in (5, 15)
    )
    for path in kept.iterdir():
        text = path.read_text(errors="replace")
        assert text.startswith("# callgrind format"), path
        assert "\nsummary:" in text or "\ntotals:" in text, path
