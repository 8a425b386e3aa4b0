"""`runrow` run as a real process whose stdout and stderr are terminals (a pseudo-terminal each),
as a person at a shell runs it: what the CLI escapes on a terminal and leaves as it is piped."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading
from dataclasses import dataclass

from worker_support import REPO

# What prompt injection makes a model (or an API error, or a typed name) hold: retitle the
# terminal (OSC 0 ... BEL), then paint red (CSI); `\x1b[2J` would clear the screen.
HOSTILE = "\x1b]0;PWNED\x07\x1b[31mRED"
SHOWN = "\\x1b]0;PWNED\\x07\\x1b[31mRED"


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def _drain(master: int, into: list[bytes]) -> None:
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer of the terminal has closed it
            return
        if not chunk:
            return
        into.append(chunk)


def runrow_on_a_terminal(url: str | None, *args: str, env: dict[str, str] | None = None) -> Done:
    """`runrow ARGS` with stdout and stderr each a terminal of its own; the terminal's \\r\\n line
    ends read back as \\n. Both are read while it runs (a terminal holds only a few KiB)."""
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | (env or {})
    if url is not None:
        environ["DATABASE_URL"] = url
    environ["NO_COLOR"] = "1"
    terminals = [pty.openpty(), pty.openpty()]
    chunks: list[list[bytes]] = [[], []]
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "pyworker", *args],
            stdin=subprocess.DEVNULL,
            stdout=terminals[0][1],
            stderr=terminals[1][1],
            env=environ,
            cwd=REPO,
        )
    finally:
        for _, child_end in terminals:
            os.close(child_end)
    readers = [
        threading.Thread(target=_drain, args=(master, into), daemon=True)
        for (master, _), into in zip(terminals, chunks, strict=True)
    ]
    for reader in readers:
        reader.start()
    try:
        returncode = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for reader in readers:
            reader.join(timeout=10)
        for master, _ in terminals:
            os.close(master)
    out, err = (b"".join(c).decode("utf-8", "replace").replace("\r\n", "\n") for c in chunks)
    return Done(returncode, out, err)
