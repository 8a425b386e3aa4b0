"""The clients' own CPU instructions per run, counted by callgrind: `runrow worker` against PgQueuer's.

bench.instructions counts the backend; this counts the other half of a drain's CPU, the client
process, which is where `runrow worker` differs from the SQL API client that sends it the same
calls (bench.drain: about 230 µs of Python per run at `--concurrency 10`, against 25 µs for the
SQL API client and 75 µs for PgQueuer's). Timed, one process's CPU per run moves by ±20% between
runs a minute apart on this 2-core VM; instructions executed do not move with the box.

What it counts: one `runrow worker` process (the echo handler, zero-length runs, as bench.drain
runs it, logging at its default INFO) under `valgrind --tool=callgrind`, started on an empty queue
with instrumentation off (start-up runs about ten times faster uncounted); once it says it has
started, instrumentation goes on (`callgrind_control -i on`), SMALL runs are enqueued in one
transaction, and the worker gets SIGTERM once every run has ended and drains out. Another worker
does the same with LARGE runs, and the figure is the difference of the two processes' instructions
over the difference of runs, so what both pay once (their idle wait, the wake, the drain at exit)
cancels out. The peer is PgQueuer's QueueManager in drain mode on asyncpg (bench.drain's peer
row), counted the same way at each batch size from the moment it is ready (its jobs enqueued
beforehand, as bench.drain does). Each drain is checked as bench.drain checks its own: every run
completed and claimed once, audit() clean; every job logged successful.

    python -m bench.client_instructions [--concurrency 1 10] [--small 300] [--large 900]
                                           [--no-peer] [--json PATH]

Counts are stable to about 1–2%: how many runs a journal flush carries, and so how many calls a
run shares, depends on which runs a group flush finds ready. Run it on a quiet box, and at the
defaults or more: PgQueuer's count holds about 1.7 billion instructions besides its jobs (a run
of 10 jobs reads 1.68 billion, repeatably, on a quiet box), and a drain slowed by other load
moves part of that between its two processes. At 10 and 30 jobs beside make test's other worker
it read +84 and -84 million instructions per job in two runs; alone, 421,188; at the defaults,
285,706. It needs valgrind (`apt-get install
valgrind`); a run of the defaults takes a few minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from subprocess import Popen

import psycopg

from bench.common import ON_A_CLUSTER, cli
from bench.drain import ECHO, ECHO_ENQUEUE, pgqueuer_check, pgqueuer_setup, runrow_check
from pyworker.db.devdb import database_url_for, throwaway
from pyworker.db.migrate import migrate

# The peer's process: bench.drain's PgQueuer row in a process of its own, which says "ready" once
# connected and its queue manager built, then waits for a line on stdin (instrumentation is on by
# then) before it drains.
PEER_CHILD = """
import sys
from bench.client_instructions import wait_for_go
from bench.drain import pgqueuer_worker

def ready():
    print("ready", flush=True)
    wait_for_go()

pgqueuer_worker(sys.argv[1], int(sys.argv[2]), ready)
"""


def wait_for_go() -> None:
    """A line on stdin, waited for in short selects, not one blocking read: valgrind takes vgdb's
    "instrumentation on" only while the process runs, and reaches a process blocked in a system
    call only through ptrace, which a container without CAP_SYS_PTRACE refuses (CI's peer then
    counted 0 instructions, and its ratio divided by zero)."""
    while not select.select([sys.stdin], [], [], 0.05)[0]:
        pass
    sys.stdin.readline()


@contextlib.contextmanager
def counted(
    out: Path, argv: list[str], url: str, log: Path, ready: str, timeout: float
) -> Iterator[Popen[bytes]]:
    """argv under callgrind, instrumentation off through start-up (about ten times faster
    uncounted, and no part of the figure) and on once its log says `ready`; killed if still
    running when the block ends."""
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", *argv],
        env={**os.environ, "DATABASE_URL": url},
        stdin=subprocess.PIPE,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(proc, log, ready, timeout)
        instrument(proc)
        yield proc
        if proc.wait(timeout) != 0:
            exited(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def instrument(proc: Popen[bytes], timeout: float = 60.0) -> None:
    """Instrumentation on, and confirmed on: callgrind_control exits 0 whether or not the
    command reached the process, so its status is asked until it no longer says "switched off"
    (the command is sent again each time, in case vgdb gave up on it)."""
    deadline = time.monotonic() + timeout
    said = ""
    while time.monotonic() < deadline and proc.poll() is None:
        said = control(proc, "-i", "on") + control(proc, "-s")
        # "Events collected: Ir" once on; off, or vgdb locked out, it prints no event name.
        if re.search(r"Events collected: \S", said):
            return
        time.sleep(0.5)
    sys.exit(
        f"bench.client_instructions: callgrind's instrumentation did not go on in {named(proc)} "
        f"(vgdb could not reach it):\n{said}"
    )


def control(proc: Popen[bytes], *args: str) -> str:
    """callgrind_control's output; it waits on vgdb, which waits for the process without end
    when ptrace is refused and the process is blocked in a system call."""
    try:
        done = subprocess.run(
            ["callgrind_control", *args, str(proc.pid)], capture_output=True, text=True, timeout=10
        )
    except subprocess.TimeoutExpired:
        return f"callgrind_control {' '.join(args)}: no answer in 10 s\n"
    return done.stdout + done.stderr


def named(proc: Popen[bytes]) -> str:
    """The process as the user would name it: its command after valgrind's options."""
    return " ".join(map(str, proc.args[4:7]))  # type: ignore[index]


def exited(proc: Popen[bytes], log: Path) -> None:
    sys.exit(f"bench.client_instructions: {named(proc)} exited {proc.returncode}:\n{log.read_text()[-4000:]}")


def wait_for(proc: Popen[bytes], log: Path, line: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while line not in log.read_text(errors="replace"):
        if proc.poll() is not None:
            exited(proc, log)
        if time.monotonic() > deadline:
            sys.exit(f"bench.client_instructions: no {line!r} from {named(proc)} in {timeout:.0f} s")
        time.sleep(0.1)


def totals(out: Path) -> int:
    for line in out.read_text(errors="replace").splitlines():
        if line.startswith(("totals:", "summary:")):
            if int(line.split()[1]) == 0:
                sys.exit(f"bench.client_instructions: callgrind counted nothing in {out}")
            return int(line.split()[1])
    sys.exit(f"bench.client_instructions: no callgrind totals in {out}")


UNENDED = (
    "SELECT count(*) FROM runrow.agent_run WHERE status NOT IN ('completed', 'failed', 'cancelled', 'dead')"
)


def unended(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(UNENDED).fetchone()
    assert row is not None
    return int(row[0])


def worker_drain(url: str, runs: int, concurrency: int, out: Path, log: Path, timeout: float = 900.0) -> int:
    """One `runrow worker` under callgrind, started on an empty queue, drains `runs` runs
    enqueued in one transaction once it is counted; its instructions from then to its exit."""
    argv = [sys.executable, "-m", "pyworker", "worker", "--handler", ECHO, "--concurrency", str(concurrency)]
    argv += ["--poll", "1", "--reap-interval", "3600", "--trim-after", "0", "--lease", "600"]
    with counted(
        out, [*argv, "--worker-id", "bench-callgrind"], url, log, "worker bench-callgrind started", timeout
    ) as proc:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(ECHO_ENQUEUE, (runs,))
        deadline = time.monotonic() + timeout
        while unended(url):
            if proc.poll() is not None:
                exited(proc, log)
            if time.monotonic() > deadline:
                sys.exit(f"bench.client_instructions: the worker did not drain in {timeout:.0f} s")
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # a drain: it exits 0 once its runs have ended
    return totals(out)


def peer_drain(url: str, batch: int, out: Path, log: Path, timeout: float = 900.0) -> int:
    """PgQueuer's QueueManager under callgrind drains the database's jobs, counted from the
    moment it is ready to its exit; its instructions."""
    with counted(
        out, [sys.executable, "-c", PEER_CHILD, url, str(batch)], url, log, "ready", timeout
    ) as proc:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
    return totals(out)


def worker_shape(concurrency: int) -> str:
    return f"runrow worker, --concurrency {concurrency}"


def peer_shape(batch: int) -> str:
    return f"PgQueuer, batch {batch}"


def ratio_shape(concurrency: int) -> str:
    return f"runrow worker/PgQueuer, {concurrency}"


def count(concurrencies: list[int], small: int, large: int, with_peer: bool = True) -> dict[str, float]:
    """Client instructions per run for each shape (worker_shape, and peer_shape at the same
    sizes unless with_peer is False), and the worker's over the peer's (ratio_shape)."""
    shapes = [("runrow", c) for c in concurrencies]
    if with_peer:
        shapes += [("pgqueuer", c) for c in concurrencies]
    figures: dict[str, float] = {}
    with throwaway() as cluster, tempfile.TemporaryDirectory(prefix="runrow-client-callgrind-") as scratch:
        urls: dict[tuple[str, int, int], str] = {}
        with psycopg.connect(cluster.superuser_url, autocommit=True) as conn:
            for system, c in shapes:
                for n in (small, large):
                    name = f"client_{system}_{c}_n{n}"
                    conn.execute(f"CREATE DATABASE {name} OWNER runrow_admin")
                    url = database_url_for(cluster.url, name)
                    if system == "pgqueuer":
                        pgqueuer_setup(url, n)
                    else:
                        migrate(url)  # the worker's runs are enqueued once it is counted
                    urls[system, c, n] = url
        for system, c in shapes:
            counts: dict[int, int] = {}
            for n in (small, large):
                url = urls[system, c, n]
                out, log = Path(scratch) / f"cg.{system}.{c}.{n}", Path(scratch) / f"log.{system}.{c}.{n}"
                if system == "pgqueuer":
                    counts[n] = peer_drain(url, c, out, log)
                    pgqueuer_check(url, n)  # every job logged successful, none left
                else:
                    counts[n] = worker_drain(url, n, c, out, log)
                    runrow_check(url, n)  # every run completed once, claimed once; audit() clean
            figure = (counts[large] - counts[small]) / (large - small)
            figures[peer_shape(c) if system == "pgqueuer" else worker_shape(c)] = figure
    if with_peer:
        for c in concurrencies:
            figures[ratio_shape(c)] = figures[worker_shape(c)] / figures[peer_shape(c)]
    return figures


def report(figures: dict[str, float]) -> list[str]:
    lines = ["=== client instructions per run (callgrind; the client process alone, not its backend) ==="]
    for shape, figure in figures.items():
        if "/" in shape:
            lines.append(f"  {shape + ':':<40} {figure:>11.2f}x")
        else:
            lines.append(f"  {shape + ':':<40} {figure:>12,.0f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = cli(
        "bench.client_instructions",
        "Instructions per run of the client process itself: one `runrow worker` (echo "
        "handler, zero-length runs) at each --concurrency, and PgQueuer's QueueManager at the same "
        "batch size, each under callgrind (difference between a SMALL and a LARGE drain).",
        ON_A_CLUSTER,
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[1, 10],
        help="the worker's --concurrency, and PgQueuer's batch size (default 1 10)",
    )
    parser.add_argument("--small", type=int, default=300, help="runs of the smaller drain (default 300)")
    parser.add_argument("--large", type=int, default=900, help="runs of the larger drain (default 900)")
    parser.add_argument(
        "--peer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also count PgQueuer and print the ratios (default on; needs the bench extra)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to PATH")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        sys.exit("bench.client_instructions: valgrind is not installed (apt-get install valgrind)")
    if args.small < 1 or args.large <= args.small:
        parser.error("--small must be at least 1 and --large more than --small")
    if any(c < 1 or c > 1000 for c in args.concurrency):
        parser.error("--concurrency must be 1 to 1000 (the worker's own range)")
    if args.peer:
        try:
            import asyncpg  # noqa: F401
            import pgqueuer  # noqa: F401
        except ImportError:
            sys.exit(
                "bench.client_instructions: PgQueuer is not installed: pip install -e '.[bench]' "
                "(or pass --no-peer to count the worker alone)"
            )
    figures = count(args.concurrency, args.small, args.large, args.peer)
    for line in report(figures):
        print(line)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
