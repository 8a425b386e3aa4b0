"""A worker stopped before its database ever answered: nothing was claimed, so there is nothing
to drain, and the first Ctrl-C or SIGTERM ends the wait at once. It used to wait out the pool's
30 s and then report that it could not connect (exit 2), as though nobody had asked it to stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest


def signalled_at(
    needle: str,
    signum: signal.Signals,
    args: list[str],
    env: dict[str, str],
    then: Callable[[], object] = list,
) -> tuple[int, str]:
    """Start `runrow worker ARGS`, send it `signum` once it logs `needle`, call `then`; its exit
    status and everything it logged."""
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "pyworker", "worker", *args],
        stderr=subprocess.PIPE,
        text=True,
        env={**environ, **env},
        # A background job inherits SIGINT ignored: give the worker the terminal's.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert worker.stderr is not None
    seen = []
    try:
        for line in worker.stderr:
            seen.append(line)
            if needle in line:
                break
        else:
            pytest.fail("".join(seen))
        worker.send_signal(signum)
        then()
        rest = worker.communicate(timeout=25)[1]
    finally:
        worker.kill()
    return worker.returncode, "".join(seen) + rest


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_before_the_database_answers_stops_the_worker(signum: signal.Signals) -> None:
    # Port 1 refuses at once, so the pool retries for its 30 s.
    unreachable = "postgresql://nobody:s3cret@127.0.0.1:1/none?connect_timeout=2"
    code, log = signalled_at(
        "worker early connecting to 127.0.0.1:1/none",  # the handlers are installed before this line
        signum,
        ["--worker-id", "early"],
        {"DATABASE_URL": unreachable, "ANTHROPIC_API_KEY": "test-key"},
    )
    assert code == 0, log
    assert "stopped before the database answered: nothing was claimed" in log
    assert "Traceback" not in log and "s3cret" not in log


SLOW_HANDLER = """
import os, sys, time

print("slow_handler: loading", file=sys.stderr, flush=True)
deadline = time.monotonic() + 30
while not os.path.exists(os.environ["SLOW_HANDLER_GO"]) and time.monotonic() < deadline:
    time.sleep(0.02)

async def handle(ctx):
    return {}
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_worker_still_loads_its_handler_stops_it_cleanly(
    signum: signal.Signals, tmp_path: Path
) -> None:
    """Worker.run installs its handlers only once the handler and tools are imported (2-3 s for
    the agent's). A SIGTERM in that window killed the worker by the signal (status -15), as
    `runrow demo` stopped at its start reported for both workers. Here the handler's import waits
    for a file, so the signal lands there every time."""
    (tmp_path / "slow_handler.py").write_text(SLOW_HANDLER)
    go = tmp_path / "go"
    code, log = signalled_at(
        "slow_handler: loading",
        signum,
        ["--worker-id", "loading", "--handler", "slow_handler:handle"],
        {
            "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p),
            "SLOW_HANDLER_GO": str(go),
            # Never asked: the worker stops before it connects.
            "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2",
        },
        then=go.touch,
    )
    assert code == 0, log
    assert f"{signum.name}: draining" in log, log
    assert "stopped before the database answered: nothing was claimed" in log, log
    assert "connecting to" not in log and "Traceback" not in log, log
