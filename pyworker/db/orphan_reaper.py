"""Removes a throwaway server whose owner died without removing it.

`devdb.throwaway` stops its cluster in a `finally`, and `pgbouncer.running` its pooler, which a
SIGKILL never reaches and a SIGTERM reaches only in a process that turned the signal into an
exception (Python's default is to die at once). The servers run in process trees of their own,
so they outlived their owner: a benchmark or test run stopped by a CI timeout left a postmaster
(and a pgbouncer) and their temp folders behind, every time.

This process is started by the owner in a session of its own (a signal to the owner's process
group does not reach it) with the read end of a pipe as its stdin. The write end lives only in
the owner (not inherited across exec), so the kernel closes it when the owner exits, however it
exits. The read then returns, and the server is stopped and its folder removed. After a normal
exit the owner has already done that and wrote a byte before closing the pipe: the reaper reads
it and does nothing (acting on the path then, it would have followed a link made there since).

    python -m pyworker.db.orphan_reaper cluster CLUSTER_JSON  < pipe
    python -m pyworker.db.orphan_reaper process PID FOLDER    < pipe
    python -m pyworker.db.orphan_reaper folder FOLDER         < pipe
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import time

from pyworker.db import devdb


def stop_process(pid: int, folder: str) -> None:
    """SIGTERM `pid`, then SIGKILL after 10 s, then remove `folder`; nothing at all if the folder
    is gone (the owner stopped it: the pid may belong to someone else by now)."""
    if not os.path.isdir(folder):
        return
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    shutil.rmtree(folder, ignore_errors=True)


# How long `folder` waits for the processes working in the folder (the demo's workers, which the
# owner's death sent SIGTERM and which drain for up to 5 s) before it removes it anyway.
FOLDER_WAIT = 30.0


def _working_in(folder: str) -> list[int]:
    """The processes whose working directory is `folder` or below it."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if cwd == folder or cwd.startswith(folder + "/"):
                pids.append(int(entry))
    return pids


def identity(folder: str) -> tuple[int, int] | None:
    """(device, inode) of `folder` itself, None unless it is a directory (a link is not)."""
    try:
        st = os.lstat(folder)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def remove_folder(folder: str, seen: tuple[int, int] | None) -> None:
    """Remove `folder` once no process works in it (at most FOLDER_WAIT s): a worker still
    draining could write into it, and its tools would make its workspace again. Only the
    directory seen when the reaper started (`seen`), never what a link there points to."""
    if seen is None or identity(folder) != seen:
        return
    resolved = os.path.realpath(folder)  # how /proc spells the workers' working directories
    deadline = time.monotonic() + FOLDER_WAIT
    while _working_in(resolved) and time.monotonic() < deadline:
        time.sleep(0.1)
    if identity(folder) == seen:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    seen = identity(argv[2]) if argv[1] == "folder" else None
    if sys.stdin.buffer.read():  # returns at EOF: the owner has exited; a byte: it released us
        return 0
    if argv[1] == "cluster":
        devdb.stop(devdb.Cluster.from_json(argv[2]))
    elif argv[1] == "folder":
        remove_folder(argv[2], seen)
    else:
        stop_process(int(argv[2]), argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
