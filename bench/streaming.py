"""What streaming runs cost the database: `runrow worker` streaming echo runs, its journal flush
batched across runs, against the same worker sending one append_events per run.

N echo runs, each streaming a TEXT_CHARS-character answer over DURATION seconds (one
text_delta every 0.05 s, as the echo handler steps), through one `runrow worker --concurrency
C` (logging at WARNING). Two systems, each in a fresh database of one private cluster with
`track_functions = all`, run one after the other:

- `runrow worker`: as shipped. A flush of the deltas of BATCH_MIN_RUNS (3) or more runs is one
  append_runs_events call (issue 11's stop 47);
- the same worker with that batching switched off (`journal.BATCH_MIN_RUNS` set out of reach in
  its process): one append_events per run with deltas in a flush, as before stop 47.

Counted from the database, none of it timed: the calls of the journal functions and of the
endings (pg_stat_user_functions), the transactions the workers' sessions committed
(pg_stat_database), the WAL written (the cluster is otherwise idle) and the text_delta rows.
How many deltas a flush carries depends on the flush ticks (50 ms), so the calls move a little
from run to run; the ratio between the systems is the figure. The wall time and the worker's
CPU are printed for reference. Each drain is checked: every run completed on its first attempt
and claimed once, its deltas' text its result, audit() clean.

    python -m bench.streaming [--runs 60] [--concurrency 20] [--duration 2] [--json PATH]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from bench import cpu
from bench.common import ON_A_CLUSTER, cli
from bench.drain import ECHO, runrow_check, settled
from pyworker.db.devdb import database_url_for, throwaway
from pyworker.db.migrate import migrate

RUNS = 60
CONCURRENCY = 20
DURATION = 2.0
TEXT_CHARS = 600
# The journal writes a worker sends, and its endings.
FUNCTIONS = ("append_events", "append_runs_events", "finish_runs", "finish_and_claim_runs")

BATCHED = "runrow worker"
PER_RUN = "runrow worker, one append_events per run"
# The same worker, its flush never batching appends across runs (stop 47's code path off).
PER_RUN_CHILD = (
    "import sys\n"
    "import pyworker.worker.journal as journal\n"
    "journal.BATCH_MIN_RUNS = sys.maxsize\n"
    "from pyworker.cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
SYSTEMS = {
    BATCHED: [sys.executable, "-m", "pyworker"],
    PER_RUN: [sys.executable, "-c", PER_RUN_CHILD],
}


@dataclass
class Row:
    system: str
    runs: int
    deltas: int
    calls: dict[str, int]
    commits: int
    wal_bytes: int
    seconds: float
    client_cpu: float | None

    @property
    def appends(self) -> int:
        return self.calls["append_events"] + self.calls["append_runs_events"]


def enqueue(url: str, runs: int, duration: float) -> None:
    text = ("streamed words " * (TEXT_CHARS // 15 + 1))[:TEXT_CHARS]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT count(*) FROM (SELECT runrow.enqueue_run(conversation_id => gen_random_uuid(),"
            " content => '\"stream\"', model => 'echo', metadata => %s::jsonb)"
            " FROM generate_series(1, %s)) AS e",
            (json.dumps({"echo": text, "duration": duration}), runs),
        )


def function_calls(url: str) -> dict[str, int]:
    """Calls of FUNCTIONS in the database since it was made (pg_stat_user_functions is per
    database; the migration and the enqueue call none of them)."""
    calls = dict.fromkeys(FUNCTIONS, 0)
    with psycopg.connect(url) as conn:
        for name, n in conn.execute(
            "SELECT funcname, calls FROM pg_stat_user_functions"
            " WHERE schemaname = 'runrow' AND funcname = ANY(%s)",
            (list(FUNCTIONS),),
        ).fetchall():
            calls[name] = int(n)
    return calls


def drain(system: str, server: str, superuser: str, runs: int, concurrency: int, duration: float) -> Row:
    """One worker process of `system` streams `runs` queued echo runs to their end in a fresh
    database of the cluster; the counts are those of the database between the worker's start
    and its exit (its start-up and drain included: a few transactions, no journal write)."""
    name = "stream_per_run" if system == PER_RUN else "stream_batched"
    with psycopg.connect(superuser, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name} OWNER runrow_admin")
        admin.execute(f"ALTER DATABASE {name} SET track_functions = 'all'")
    url = database_url_for(server, name)
    migrate(url)
    enqueue(url, runs, duration)
    as_super = make_conninfo(superuser, dbname="postgres")
    with psycopg.connect(as_super, autocommit=True) as observer:
        before = settled(observer, name, others=0)
        cmd = [*SYSTEMS[system], "--log-level", "WARNING", "worker", "--handler", ECHO]
        cmd += ["--concurrency", str(concurrency), "--worker-id", "stream", "--poll", "1"]
        cmd += ["--reap-interval", "3600", "--trim-after", "0", "--lease", "600"]
        started = time.monotonic()
        worker = subprocess.Popen(
            cmd, env={**os.environ, "DATABASE_URL": url}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        polls = 0  # each a transaction committed in the database: not the worker's
        try:
            with psycopg.connect(url, autocommit=True) as poll:
                while True:
                    polls += 1
                    left = poll.execute(
                        "SELECT EXISTS (SELECT FROM runrow.agent_run WHERE status IN ('queued', 'running'))"
                    ).fetchone()
                    if not (left and left[0]):
                        break
                    if worker.poll() is not None:
                        raise AssertionError(f"{system} exited {worker.returncode}: {worker.stdout.read()!r}")
                    time.sleep(0.05)
            seconds = time.monotonic() - started
            client_cpu = cpu.process_seconds(worker.pid)
            worker.send_signal(signal.SIGTERM)
            out, _ = worker.communicate(timeout=60)
            assert worker.returncode == 0, (
                f"{system} exited {worker.returncode}: {out.decode(errors='replace')}"
            )
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        spent = settled(observer, name, others=0).since(before)
    runrow_check(url, runs)  # every run completed once, claimed once; audit() clean
    with psycopg.connect(url) as conn:
        deltas = conn.execute("SELECT count(*) FROM runrow.run_event WHERE type = 'text_delta'").fetchone()[0]
    return Row(
        system,
        runs,
        int(deltas),
        function_calls(url),
        spent.commits - polls,
        spent.wal_bytes,
        seconds,
        client_cpu,
    )


def run(runs: int, concurrency: int, duration: float) -> tuple[list[str], list[Row]]:
    with throwaway() as cluster:
        rows = [
            drain(system, cluster.url, cluster.superuser_url, runs, concurrency, duration)
            for system in SYSTEMS
        ]
    return report(rows, concurrency, duration), rows


def report(rows: list[Row], concurrency: int, duration: float) -> list[str]:
    batched, per_run = rows
    lines = [
        f"=== streaming: {batched.runs} echo runs of {duration:g} s ({TEXT_CHARS} characters each)"
        f" through one runrow worker --concurrency {concurrency} ===",
        f"  {'':<42} {'text_delta':>10} {'appends':>8} {'batched':>8} {'endings':>8}"
        f" {'commits':>8} {'WAL/run':>9} {'wall':>6} {'worker CPU':>10}",
    ]
    for r in rows:
        endings = r.calls["finish_runs"] + r.calls["finish_and_claim_runs"]
        cpu_cell = "" if r.client_cpu is None else f"{r.client_cpu:.2f} s"
        batched_calls = r.calls["append_runs_events"]
        lines.append(
            f"  {r.system:<42} {r.deltas:>10,} {r.appends:>8,} {batched_calls:>8,} {endings:>8,}"
            f" {r.commits:>8,} {r.wal_bytes / r.runs:>9,.0f} {r.seconds:>5.1f}s {cpu_cell:>10}"
        )
    lines.append(
        f"  batched / per run: journal calls {batched.appends / per_run.appends:.2f}x,"
        f" commits {batched.commits / per_run.commits:.2f}x, WAL {batched.wal_bytes / per_run.wal_bytes:.2f}x"
        " (appends: append_events + append_runs_events calls; batched: the latter)"
    )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = cli("bench.streaming", __doc__, ON_A_CLUSTER)
    parser.add_argument("--runs", type=int, default=RUNS, metavar="N", help=f"echo runs (default {RUNS})")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=CONCURRENCY,
        metavar="C",
        help=f"the worker's slots (default {CONCURRENCY})",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=DURATION,
        metavar="SECONDS",
        help=f"how long each run streams (default {DURATION:g}; one delta every 0.05 s)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to PATH")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not 1 <= args.concurrency <= 1000:
        parser.error("--concurrency must be 1 to 1000")
    if not 0.05 <= args.duration <= 600:
        parser.error("--duration must be 0.05 to 600 seconds")
    lines, rows = run(args.runs, args.concurrency, args.duration)
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "appends": r.appends} for r in rows], indent=2))


if __name__ == "__main__":
    main()
