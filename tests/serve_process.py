"""`runrow serve` as a real process on a free port, for tests of signals, logs and flags."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from http_support import TOKENS
from worker_support import REPO


@dataclass
class ServeProcess:
    proc: subprocess.Popen[bytes]
    err: Path  # its stderr, every log line
    url: str

    def log(self) -> str:
        return self.err.read_text()


@contextlib.contextmanager
def serve_process(
    db: str, tmp_path: Path, args: list[str], env: dict[str, str] | None = None
) -> Iterator[ServeProcess]:
    """`runrow serve --port 0 ARGS` with TOKENS in RUNROW_TOKENS; killed on the way out."""
    err = tmp_path / "serve.err"
    tokens = ",".join(f"{token}={user}" for token, user in TOKENS.items())
    with err.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyworker", "serve", "--port", "0", *args],
            cwd=REPO,
            env=dict(os.environ, DATABASE_URL=db, RUNROW_TOKENS=tokens, **(env or {})),
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    try:
        yield ServeProcess(proc, err, f"http://127.0.0.1:{bound_port(proc, err)}")
    finally:
        proc.kill()
        proc.wait(20)


def bound_port(proc: subprocess.Popen[bytes], err: Path, name: str = "Uvicorn running on") -> int:
    """The port the log says it listens on (--port 0), read in whatever format it is written."""
    deadline = time.monotonic() + 30
    pattern = re.escape(name) + r" http://127\.0\.0\.1:(\d+)"
    while True:
        found = re.search(pattern, err.read_text())
        if found:
            return int(found.group(1))
        assert proc.poll() is None, f"runrow serve exited {proc.returncode}:\n{err.read_text()}"
        assert time.monotonic() < deadline, f"runrow serve did not start in 30 s:\n{err.read_text()}"
        time.sleep(0.05)
