"""Removes a throwaway cluster whose owner died without removing it.

`devdb.throwaway` stops its cluster in a `finally`, which a SIGKILL never reaches and a SIGTERM
reaches only in a process that turned the signal into an exception (Python's default is to die
at once). The server runs in a process tree of its own, so it outlived its owner: a benchmark
or test run stopped by a CI timeout left a postmaster and its temp folder behind, every time.

This process is started by the owner in a session of its own (a signal to the owner's process
group does not reach it) with the read end of a pipe as its stdin. The write end lives only in
the owner (not inherited across exec), so the kernel closes it when the owner exits, however it
exits. The read then returns, and the cluster is stopped and its folder removed; after a normal
exit the owner has already done that, and there is nothing left to do.

    python -m pyworker.db.orphan_reaper CLUSTER_JSON  < pipe
"""

from __future__ import annotations

import sys

from pyworker.db import devdb


def main(argv: list[str]) -> int:
    cluster = devdb.Cluster.from_json(argv[1])
    sys.stdin.buffer.read()  # returns at EOF: the owner has exited
    devdb.stop(cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
