"""`runrow db run -- CMD` passes a signal sent to it on to CMD, waits for CMD, stops the cluster and
exits 128 + the signal. Real processes, real signals, a real throwaway cluster.

Before, runrow waited in subprocess.call: SIGTERM killed runrow alone, the orphan reaper removed
the cluster, and CMD ran on, orphaned (`sleep 100` alive a minute later).
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from worker_support import REPO

# CMD prints its pid and DATABASE_URL, then becomes `sleep 100` (same pid).
SLEEPER = ["sh", "-c", 'echo "$$ $DATABASE_URL"; exec sleep 100']


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _cluster_root(url: str) -> Path:
    """The throwaway cluster's folder: the parent of its socket directory."""
    return Path(parse_qs(urlsplit(url).query)["host"][0]).parent


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_db_run_reaches_cmd_and_the_cluster_is_stopped_after_it(sig: signal.Signals) -> None:
    if signal.getsignal(sig) is signal.SIG_IGN:
        pytest.skip(f"{sig.name} is ignored here (a background job), and so by runrow: it passes nothing on")
    runrow = subprocess.Popen(
        [sys.executable, "-m", "pyworker", "db", "run", "--", *SLEEPER],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=REPO,
        start_new_session=True,  # the signal goes to runrow alone, never to CMD by its group
    )
    try:
        assert runrow.stdout is not None
        pid_text, url = runrow.stdout.readline().split(maxsplit=1)
        cmd, root = int(pid_text), _cluster_root(url)
        postmaster = int((root / "data" / "postmaster.pid").read_text().split()[0])
        assert _alive(cmd) and _alive(postmaster)

        runrow.send_signal(sig)
        assert runrow.wait(timeout=60) == 128 + sig
        # Before: runrow died of the signal (-sig), and `sleep 100` ran on.
        assert not _alive(cmd), "CMD outlived `runrow db run`"
        # Stopped by runrow itself, before it exited: not left to the orphan reaper.
        assert not _alive(postmaster) and not root.exists()
    finally:
        if runrow.poll() is None:
            runrow.kill()
            runrow.wait()


@pytest.mark.parametrize(("script", "code"), [("exit 7", 7), ("kill -TERM $$", 128 + signal.SIGTERM)])
def test_db_run_exits_with_cmds_code_or_128_plus_the_signal_that_ended_it(script: str, code: int) -> None:
    """A CMD that a signal ended was exit 241 (-15 as a byte), not the shell's 143."""
    done = subprocess.run(
        [sys.executable, "-m", "pyworker", "db", "run", "--", "sh", "-c", script],
        env=_env(),
        cwd=REPO,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == code, done.stderr


# CMD counts the SIGINTs it gets; a SIGTERM makes it print the count and exit 0.
COUNTER = """
import signal, sys
seen = []
signal.signal(signal.SIGINT, lambda *_: (seen.append(1), print("int", flush=True)))
signal.signal(signal.SIGTERM, lambda *_: (print(f"sigints={len(seen)} end", flush=True), sys.exit(0)))
print("ready", flush=True)
while True:
    signal.pause()
"""


def _read_until(fd: int, marker: bytes, seen: bytearray, deadline: float) -> None:
    """Read the terminal's output into `seen` until it holds `marker`."""
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} in {bytes(seen)!r}"
        if select.select([fd], [], [], left)[0]:
            try:
                seen += os.read(fd, 4096)
            except OSError:  # EIO: every process on the terminal is gone
                assert marker in seen, f"no {marker!r} in {bytes(seen)!r}"


def test_ctrl_c_on_a_terminal_reaches_cmd_once() -> None:
    """The terminal sends Ctrl-C's SIGINT to its whole foreground process group, CMD included:
    runrow must not send it again (a worker's second signal skips its drain). The SIGTERM sent
    afterwards is passed on, after the SIGINT (the lower signal is taken first), so CMD's count
    is final when it prints it; and runrow's code is that SIGTERM's, the one signal it passed on
    (130 when it sent the Ctrl-C on too, whose second copy CMD may see merged with the first)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        pytest.skip("SIGINT is ignored here (a background job), and so by runrow")
    master, slave = os.openpty()
    runrow = subprocess.Popen(
        # setsid -c: a session of its own whose controlling terminal is the pty, runrow (and the
        # CMD it starts) its foreground process group.
        [
            "setsid",
            "-c",
            sys.executable,
            "-m",
            "pyworker",
            "db",
            "run",
            "--",
            sys.executable,
            "-u",
            "-c",
            COUNTER,
        ],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=_env(),
        cwd=REPO,
    )
    os.close(slave)
    seen = bytearray()
    try:
        deadline = time.monotonic() + 60
        _read_until(master, b"ready", seen, deadline)
        os.write(master, b"\x03")  # Ctrl-C
        _read_until(master, b"int", seen, deadline)
        runrow.send_signal(signal.SIGTERM)
        _read_until(master, b" end", seen, deadline)
        assert runrow.wait(timeout=60) == 128 + signal.SIGTERM, bytes(seen)
        assert re.search(rb"sigints=(\d+)", seen)[1] == b"1", bytes(seen)  # type: ignore[index]
    finally:
        if runrow.poll() is None:
            runrow.kill()
            runrow.wait()
        os.close(master)
