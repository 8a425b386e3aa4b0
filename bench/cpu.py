"""CPU seconds spent by processes, read from /proc (Linux), for the benchmarks' split of a job's
cost between the client processes and the database server.

A throughput ratio says which system is faster on this box; the split says where each spends:
on 2 cores, jobs/s is about 2 / (client + server CPU per job) once both are busy, so a system
whose server side alone costs more per job than its peer's whole job cannot match the peer
however lean its client is.

Every reader returns None where /proc cannot tell (another OS, a server on another host), and
the benchmarks then print no split rather than a wrong one.
"""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def _own(fields: list[str]) -> float:
    """utime + stime of a /proc stat: the process's own CPU (all its threads), in seconds."""
    return (int(fields[11]) + int(fields[12])) / _TICK


def process_seconds(pid: int) -> float | None:
    """User + system CPU of one live process (all its threads), or None."""
    fields = _stat(pid)
    return None if fields is None else _own(fields)


def parent_of(pid: int) -> int | None:
    fields = _stat(pid)
    return None if fields is None else int(fields[1])


def command(pid: int) -> str | None:
    """The process's command name (`comm`, e.g. "postgres"), or None."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def tree_seconds(root: int) -> float | None:
    """CPU of `root` and of every child it has had: the children it has reaped are in its own
    cutime/cstime, the live ones (and those exited but not yet reaped) are read one by one. For
    a postmaster that is the whole cluster: backends, also those gone since, and the background
    processes (WAL writer, checkpointer, autovacuum). Read until the root's reaped total holds
    still across the scan, so a child reaped meanwhile is counted once."""
    for _ in range(10):
        before = _stat(root)
        if before is None:
            return None
        total = sum(int(f) for f in before[11:15]) / _TICK
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                fields = _stat(int(entry.name))
                if fields is not None and int(fields[1]) == root:
                    total += _own(fields)
        after = _stat(root)
        if after is not None and after[13:15] == before[13:15]:
            return total
    return None


def own_seconds() -> float:
    """This process's user + system CPU (os.times, portable)."""
    t = os.times()
    return t.user + t.system
