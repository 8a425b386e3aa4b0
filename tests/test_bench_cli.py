"""Every benchmark's command line teaches and refuses as a command should: `--help` prints its
usage and exits 0 without touching a database, and an option it does not know is a usage error
(exit 2) naming it, not a run. Before this, most `python -m bench.<name>` read sys.argv by hand:
`python -m bench.trim --help` with DATABASE_URL set started the 1,000,000-run trim (about two
hours), `python -m bench --help` all of `make bench`, and a misspelt `--run 5000` ran the full
size."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
# Not a server: a benchmark that connects fails at once instead of running.
NOWHERE = "postgresql://nobody@/nowhere?host=/nonexistent-runrow-bench-cli"


def commands() -> list[str]:
    """`bench` (make bench) and every module of it that runs as `python -m bench.<name>`."""
    modules = sorted(
        f"bench.{path.stem}"
        for path in BENCH.glob("*.py")
        if path.stem not in ("__init__", "__main__") and 'if __name__ == "__main__":' in path.read_text()
    )
    return ["bench", *modules]


def run(
    module: str, args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[object, str, str]:
    """(exit code, stdout, stderr) of `python -m <module> *args`, run in this process as -m runs it
    (runpy, as __main__), so module-level argument handling is exercised too."""
    monkeypatch.setenv("DATABASE_URL", NOWHERE)
    monkeypatch.setattr(sys, "argv", [module, *args])
    name = f"{module}.__main__" if module == "bench" else module
    monkeypatch.delitem(sys.modules, name, raising=False)  # runpy runs a fresh copy, as -m does
    with pytest.raises(SystemExit) as exited:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    out, err = capsys.readouterr()
    return exited.value.code, out, err


def test_every_runnable_module_is_covered() -> None:
    names = commands()
    assert {"bench", "bench.trim", "bench.drain", "bench.claim_buffers", "bench.fairness"} <= set(names)


@pytest.mark.parametrize("module", commands())
def test_help_prints_usage_and_runs_nothing(
    module: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(module, ["--help"], monkeypatch, capsys)
    assert code == 0, err[-2000:]
    assert out.startswith(f"usage: python -m {module}"), out[:500]
    assert "DATABASE_URL" in out or "cluster" in out, out


@pytest.mark.parametrize("module", commands())
def test_an_unknown_option_is_a_usage_error(
    module: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(module, ["--no-such-option"], monkeypatch, capsys)
    assert code == 2, (code, out[-1000:], err[-2000:])
    assert "unrecognized arguments: --no-such-option" in err, err[-2000:]
