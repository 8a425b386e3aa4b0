"""A worker stopped before its database ever answered: nothing was claimed, so there is nothing
to drain, and the first Ctrl-C or SIGTERM ends the wait at once. It used to wait out the pool's
30 s and then report that it could not connect (exit 2), as though nobody had asked it to stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_before_the_database_answers_stops_the_worker(signum: signal.Signals) -> None:
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    # Port 1 refuses at once, so the pool retries for its 30 s.
    unreachable = "postgresql://nobody:s3cret@127.0.0.1:1/none?connect_timeout=2"
    worker = subprocess.Popen(
        [sys.executable, "-m", "pyworker", "worker", "--worker-id", "early"],
        stderr=subprocess.PIPE,
        text=True,
        env={**environ, "DATABASE_URL": unreachable, "ANTHROPIC_API_KEY": "test-key"},
    )
    assert worker.stderr is not None
    seen = []
    for line in worker.stderr:  # the handlers are installed before this line is logged
        seen.append(line)
        if "worker early connecting to 127.0.0.1:1/none" in line:
            break
    else:
        pytest.fail("".join(seen))
    worker.send_signal(signum)
    try:
        rest = worker.communicate(timeout=25)[1]
    finally:
        worker.kill()
    log = "".join(seen) + rest
    assert worker.returncode == 0, log
    assert "stopped before the database answered: nothing was claimed" in log
    assert "Traceback" not in log and "s3cret" not in log
