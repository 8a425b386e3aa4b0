"""bench/client_instructions.py at a small size, run as a reader of the README runs it: a real
`runrow worker` and PgQueuer's queue manager, each a process under callgrind counted from the
moment it is ready, each drain checked to end every run once, the figure a difference of two
processes' counts. At 10 and 30 runs one idle poll tick weighs too much for the figure to mean
more than "counted and in a client's range"; `make bench` runs it at 300 and 900."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.client_instructions import instrument, totals

ROOT = Path(__file__).resolve().parent.parent

needs_valgrind = pytest.mark.skipif(
    shutil.which("valgrind") is None, reason="valgrind is not installed (make test installs it)"
)


@needs_valgrind
def test_the_worker_and_its_peer_are_counted_per_run(tmp_path: Path) -> None:
    out = tmp_path / "client.json"
    done = subprocess.run(
        [
            *[sys.executable, "-m", "bench.client_instructions", "--concurrency", "10"],
            *["--small", "10", "--large", "30", "--json", str(out)],
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    worker, peer = figures["runrow worker, --concurrency 10"], figures["PgQueuer, batch 10"]
    # A run through a Python client is hundreds of thousands of instructions, not a handful
    # (instrumentation never went on). The worker's start-up (billions, over 20 runs) would show
    # as hundreds of millions. The peer's figure gets no bound at this size: PgQueuer's process
    # holds about 1.7 billion instructions besides its jobs, and on a box loaded by the other
    # pytest worker part of it moved between the two processes (+84M and -84M per job over 20
    # jobs, in two fresh clones); make bench counts 600, on a quiet box.
    assert 100_000 < worker < 50_000_000, done.stdout
    assert figures["runrow worker/PgQueuer, 10"] == pytest.approx(worker / peer)
    for line in ("runrow worker, --concurrency 10:", "PgQueuer, batch 10:", "runrow worker/PgQueuer, 10:"):
        assert line in done.stdout, done.stdout


# A process that says "ready", then waits for "go" on stdin as the peer's process does.
WAITER = "from bench.client_instructions import wait_for_go\nprint('ready', flush=True)\nwait_for_go()\n"


@needs_valgrind
@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed (make test installs it)")
def test_a_waiting_process_is_counted_where_ptrace_is_refused(tmp_path: Path) -> None:
    """CI's container refuses ptrace: vgdb could not wake the peer blocked in its read of stdin,
    and the peer's drain counted 0 instructions. An strace holding the process's one ptrace slot
    refuses vgdb the same way; instrumentation must still go on, and be confirmed on."""
    out = tmp_path / "cg.out"
    proc = subprocess.Popen(
        [
            *["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"],
            *[sys.executable, "-c", WAITER],
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    tracer = None
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        tracer = subprocess.Popen(["strace", "-p", str(proc.pid), "-o", "/dev/null"], stderr=subprocess.PIPE)
        assert tracer.stderr is not None and b"attached" in tracer.stderr.readline()
        started = time.monotonic()
        instrument(proc, timeout=40)
        assert time.monotonic() - started < 40
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        assert proc.wait(60) == 0
        assert totals(out) > 0
    finally:
        for p in (proc, tracer):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--small", "30", "--large", "10"], "--large more than --small"),
        (["--small", "0"], "--small must be at least 1"),
        (["--concurrency", "0"], "--concurrency must be 1 to 1000"),
    ],
)
def test_bad_sizes_are_refused_before_anything_starts(args: list[str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.client_instructions", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and says in done.stderr, done.stderr
