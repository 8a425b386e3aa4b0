"""A throwaway cluster does not outlive the process that owns it.

A real owner process enters `devdb.throwaway()` and is killed with a real signal: SIGKILL (no
`finally` runs) and SIGTERM (Python's default action: none runs either). Before the orphan
reaper, both left the postmaster running and its temp folder on disk.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

OWNER = textwrap.dedent(
    """
    import sys, time
    from pyworker.db import devdb

    with devdb.throwaway() as cluster:
        print(cluster.root, flush=True)
        time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_cluster_of_a_killed_owner_is_stopped_and_removed(sig: signal.Signals) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert owner.stdout is not None
        root = Path(owner.stdout.readline().strip())
        postmaster = int((root / "data" / "postmaster.pid").read_text().split()[0])
        assert _alive(postmaster)

        owner.send_signal(sig)
        assert owner.wait(timeout=10) == -sig

        deadline = time.monotonic() + 30
        while (_alive(postmaster) or root.exists()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(postmaster), "the killed owner's postmaster is still running"
        assert not root.exists(), "the killed owner's cluster folder is still on disk"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_normal_exit_dismisses_the_reaper() -> None:
    """The reaper ends with its owner's `with` block; nothing of it is left behind."""
    from pyworker.db import devdb

    with devdb.throwaway() as cluster:
        root = Path(cluster.root)
        # Popen returns once exec has begun; /proc shows the new command line a moment later.
        deadline = time.monotonic() + 10
        while not (reapers := _reapers_of(cluster.root)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(reapers) == 1, reapers
    assert not root.exists()
    assert not any(_alive(pid) for pid in reapers)


def _reapers_of(root: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pyworker.db.orphan_reaper" in argv and any(root.encode() in a for a in argv):
            found.append(int(entry.name))
    return found
