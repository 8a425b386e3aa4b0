"""Backend CPU instructions per run, counted by callgrind: a figure that does not move with the box.

Timing a change worth 4% of the backend's work is hopeless on a shared 2-core VM (two unchanged
baselines of the same drain differ by more). Instructions executed do not depend on the clock:
repeated runs of the same code agree within about 2% (random UUIDs split index pages at different
moments): quote a change smaller than that from several runs of each version.

What it counts: one session chaining `finish_and_claim_runs` (what `runrow worker` sends) at a
batch size, each ending with the events of a zero-length answer (`message_start`,
`message_stop`) or none, on a private cluster whose postmaster runs under `valgrind
--tool=callgrind` (every backend it forks is counted into a file of its own). The session drains
SMALL runs, another LARGE runs, each in a database of its own enqueued beforehand at full speed;
the figure is the difference of the two sessions' instructions over the difference of runs, so
connection start-up and the first call's planning cancel out. Each drain is then checked as
bench.drain checks its own: every run completed once, claimed once, and audit() clean.
Autovacuum is off under callgrind: an ANALYZE in the middle of a drain makes the session plan its
statements again (about 2% more on a run that met one).

The peer is counted the same way, in the same cluster: PgQueuer draining SMALL and LARGE jobs at
each batch size with one QueueManager in drain mode on asyncpg, as bench.drain runs it, and checked
as bench.drain checks it (every job logged successful, none left). Its acknowledgements are
flushed by count (batch_size) as at full speed; its timed work (heartbeats every 15 s, log
aggregation every 30 s) stays out of the figure while each drain takes less than that under
callgrind (a few seconds). The ratio printed is runrow's instructions per run without events (a
job with no output, as PgQueuer's) over PgQueuer's per job: the issue's wall-clock goals, in a
unit the box does not move. `--no-peer` leaves PgQueuer out.

    python -m bench.instructions [--batch 1 10] [--events 0 2] [--small 200] [--large 600] [--keep DIR]
                                    [--json PATH] [--no-peer] [--by-function N]

`--by-function N` then reads the drains' callgrind files and prints, for each shape counted at two
batch sizes, the N PostgreSQL functions through which most of a call's shared work and most of a
run's own work pass (bench/by_function.py says how to read it).

It needs valgrind (`apt-get install valgrind`); without it, it says so and exits. A run of the
defaults takes about two minutes. Compare two versions by running it on each.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from bench import by_function
from bench.common import ON_A_CLUSTER, cli
from bench.drain import (
    ECHO_ENQUEUE,
    FINISH_AND_CLAIM,
    acks,
    pgqueuer_check,
    pgqueuer_setup,
    pgqueuer_worker,
    runrow_check,
)
from pyworker.db.devdb import PG_BIN, Cluster, database_url_for, restart, throwaway
from pyworker.db.migrate import migrate

# What `runrow worker` journals for a zero-length answer before its complete.
EVENTS = [{"type": "message_start"}, {"type": "message_stop"}]


def chain(url: str, batch: int, events: int) -> int:
    """Drain the database's queue in one session as the worker would, each call a transaction
    that ends the last batch and claims the next; returns the backend's pid."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        claimed: list[tuple[object, object]] = []
        while True:
            with conn.transaction():
                rows = conn.execute(
                    FINISH_AND_CLAIM, (acks(claimed, EVENTS if events else None), batch)
                ).fetchall()
            ended = bool(claimed)
            claimed = [(r, t) for r, f, t in rows if f is None]
            if not claimed and not ended:
                return int(row[0])


def peer(url: str, batch: int) -> int:
    """Drain the database's PgQueuer queue as bench.drain's peer row does; returns the backend's
    pid."""
    pids: list[int] = []
    pgqueuer_worker(url, batch, lambda: None, backend_pid=pids.append)
    return pids[0]


# The figures' keys: runrow's shapes, PgQueuer's, and the ratio of the two.
def runrow_shape(batch: int, events: int) -> str:
    return f"batch {batch}, {events} events"


def peer_shape(batch: int) -> str:
    return f"PgQueuer, batch {batch}"


def ratio_shape(batch: int) -> str:
    return f"runrow/PgQueuer, batch {batch}"


_SHAPE = re.compile(r"batch (?P<batch>\d+), (?P<events>\d+) events|PgQueuer, batch (?P<peer_batch>\d+)")


def system_and_batch(shape: str) -> tuple[str, int] | None:
    """The system ("runrow, E events" or "PgQueuer") and batch of a key runrow_shape or
    peer_shape made; None for any other key (a ratio, a split figure read back from --json)."""
    m = _SHAPE.fullmatch(shape)
    if m is None:
        return None
    if m["peer_batch"] is not None:
        return "PgQueuer", int(m["peer_batch"])
    return f"runrow, {m['events']} events", int(m["batch"])


def instructions(outdir: Path, pid: int, timeout: float = 120.0) -> int:
    """The backend's instruction count, from the file callgrind writes when the process exits."""
    path = outdir / f"cg.{pid}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("totals:") or line.startswith("summary:"):
                    return int(line.split()[1])
        time.sleep(0.2)
    sys.exit(f"bench.instructions: no callgrind totals in {path}")


def kept_name(system: str, batch: int, events: int, runs: int) -> str:
    """The name --keep gives a drain's callgrind file."""
    if system == "pgqueuer":
        return f"pgqueuer-batch{batch}-jobs{runs}.callgrind"
    return f"batch{batch}-events{events}-runs{runs}.callgrind"


def report_by_function(
    kept: Path, batches: list[int], events: list[int], small: int, large: int, with_peer: bool, top: int
) -> list[str]:
    """The top functions of each shape, from the callgrind files count() kept."""
    systems = [("runrow", e, f"runrow, {e} events") for e in events]
    if with_peer:
        systems.append(("pgqueuer", 0, "PgQueuer"))
    lines: list[str] = []
    for system, e, title in systems:
        by_batch = {
            b: by_function.per_run(
                by_function.inclusive(kept / kept_name(system, b, e, small)),
                by_function.inclusive(kept / kept_name(system, b, e, large)),
                large - small,
            )
            for b in batches
        }
        lines += by_function.report(title, by_function.split(by_batch), top)
    return lines


def under_callgrind(cluster: Cluster, outdir: Path) -> None:
    """Restart the cluster's postmaster under callgrind, with the options it was started with."""
    wrapper = Path(cluster.root) / "postgres-under-callgrind"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"exec valgrind --tool=callgrind --trace-children=yes --callgrind-out-file={outdir}/cg.%p "
        f'{PG_BIN / "postgres"} "$@" -c autovacuum=off\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    if cluster.os_user is not None:
        shutil.chown(outdir, cluster.os_user)
    # pg_ctl restart reads the options from postmaster.opts; -p swaps the executable.
    restart(cluster, mode="fast", executable=str(wrapper))


def count(
    batches: list[int],
    events: list[int],
    small: int = 200,
    large: int = 600,
    keep: Path | None = None,
    with_peer: bool = True,
) -> dict[str, float]:
    """Instructions per run for each (batch, events) shape, keyed "batch B, E events"; unless
    with_peer is False, per job of PgQueuer at each batch, keyed "PgQueuer, batch B", and
    runrow's figure without events over PgQueuer's, keyed "runrow/PgQueuer, batch B"."""
    # (system, batch, events): the peer's jobs have no events.
    shapes = [("runrow", b, e) for b in batches for e in events]
    if with_peer:
        shapes += [("pgqueuer", b, 0) for b in batches]
    figures: dict[str, float] = {}
    with throwaway() as cluster:
        # Every database set up and filled at full speed first: under callgrind a migration
        # alone takes half a minute.
        urls: dict[tuple[str, int, int, int], str] = {}
        with psycopg.connect(cluster.superuser_url, autocommit=True) as conn:
            for system, b, e in shapes:
                for n in (small, large):
                    name = f"count_{system}_b{b}_e{e}_n{n}"
                    conn.execute(f"CREATE DATABASE {name} OWNER runrow_admin")
                    url = database_url_for(cluster.url, name)
                    if system == "pgqueuer":
                        pgqueuer_setup(url, n)
                    else:
                        migrate(url)
                        with psycopg.connect(url, autocommit=True) as c:
                            c.execute(ECHO_ENQUEUE, (n,))
                            c.execute("VACUUM ANALYZE runrow.agent_run")
                    urls[system, b, e, n] = url
        outdir = Path(cluster.root) / "callgrind"
        outdir.mkdir()
        under_callgrind(cluster, outdir)
        for system, b, e in shapes:
            counts = {}
            for n in (small, large):
                url = urls[system, b, e, n]
                if system == "pgqueuer":
                    pid = peer(url, b)
                    counts[n] = instructions(outdir, pid)
                    pgqueuer_check(url, n)  # every job logged successful, none left
                else:
                    pid = chain(url, b, e)
                    counts[n] = instructions(outdir, pid)
                    runrow_check(url, n)  # every run completed once, claimed once; audit() clean
                if keep is not None:
                    keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(outdir / f"cg.{pid}", keep / kept_name(system, b, e, n))
            shape = peer_shape(b) if system == "pgqueuer" else runrow_shape(b, e)
            figures[shape] = (counts[large] - counts[small]) / (large - small)
    if with_peer and 0 in events:
        for b in batches:
            figures[ratio_shape(b)] = figures[runrow_shape(b, 0)] / figures[peer_shape(b)]
    return figures


def fixed_and_per_run(figures: dict[str, float]) -> dict[str, float]:
    """Each system's instructions split into the work of a call, shared by its batch, and the
    work of each run: a run's figure at batch b is per_run + per_call / b, so two batch sizes
    give both (the smallest and the largest counted). Keyed "per call, ..." and "per run, ..."
    ("runrow, E events" or "PgQueuer"), and "runrow/PgQueuer, per call" and "..., per run" for
    runrow without events; empty with fewer than two batch sizes."""
    curves: dict[str, dict[int, float]] = {}
    for shape, figure in figures.items():
        parsed = system_and_batch(shape)
        if parsed is not None:
            system, batch = parsed
            curves.setdefault(system, {})[batch] = figure
    split: dict[str, float] = {}
    for system, by_batch in curves.items():
        if len(by_batch) < 2:
            continue
        low, high = min(by_batch), max(by_batch)
        per_call = (by_batch[low] - by_batch[high]) / (1 / low - 1 / high)
        split[f"per call, {system}"] = per_call
        split[f"per run, {system}"] = by_batch[low] - per_call / low
    if "per run, PgQueuer" in split and "per run, runrow, 0 events" in split:
        for part in ("call", "run"):
            ours, theirs = split[f"per {part}, runrow, 0 events"], split[f"per {part}, PgQueuer"]
            split[f"runrow/PgQueuer, per {part}"] = ours / theirs
    return split


def report(figures: dict[str, float]) -> list[str]:
    kinds: dict[str, list[tuple[str, float]]] = {"runrow": [], "peer": [], "ratio": []}
    for shape, figure in figures.items():
        if shape.startswith("runrow/"):
            kinds["ratio"].append((shape, figure))
        elif shape.startswith("PgQueuer"):
            kinds["peer"].append((shape, figure))
        else:
            kinds["runrow"].append((shape, figure))
    lines = ["=== backend instructions per run (callgrind; one session chaining finish_and_claim_runs) ==="]
    lines += [f"  {shape + ' per ending:':<28} {per_run:>12,.0f}" for shape, per_run in kinds["runrow"]]
    if kinds["peer"]:
        lines.append("=== PgQueuer's backend instructions per job (asyncpg, one QueueManager draining) ===")
        lines += [f"  {shape + ':':<28} {per_job:>12,.0f}" for shape, per_job in kinds["peer"]]
    if kinds["ratio"]:
        lines.append("=== runrow (no events) / PgQueuer, instructions per job: below 1 is cheaper ===")
        lines += [f"  {shape + ':':<28} {ratio:>11.2f}x" for shape, ratio in kinds["ratio"]]
    split = fixed_and_per_run(figures)
    if split:
        lines.append(
            "=== the same, split: a call's shared work (paid once per batch) and each run's own "
            "(figure at batch b = per run + per call / b) ==="
        )
        for shape, figure in split.items():
            if shape.startswith("runrow/"):
                lines.append(f"  {shape + ':':<28} {figure:>11.2f}x")
            else:
                lines.append(f"  {shape + ':':<28} {figure:>12,.0f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = cli(
        "bench.instructions",
        "Backend instructions per run of finish_and_claim_runs, and per job of PgQueuer "
        "draining beside it, counted by callgrind (difference between a SMALL and a LARGE drain); "
        "prints runrow/PgQueuer at each batch size.",
        ON_A_CLUSTER,
    )
    parser.add_argument(
        "--batch", type=int, nargs="+", default=[1, 10], help="max_runs of each call (default 1 10)"
    )
    parser.add_argument(
        "--events",
        type=int,
        nargs="+",
        choices=[0, 2],
        default=[0, 2],
        help="events per ending besides the complete (default 0 2)",
    )
    parser.add_argument("--small", type=int, default=200, help="runs of the smaller drain (default 200)")
    parser.add_argument("--large", type=int, default=600, help="runs of the larger drain (default 600)")
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="copy each session's callgrind file to DIR, to read with callgrind_annotate",
    )
    parser.add_argument(
        "--json", type=Path, metavar="PATH", help="also write the figures and their split to PATH"
    )
    parser.add_argument(
        "--peer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also count PgQueuer draining at each batch size, and print the ratios (default on; "
        "needs the bench extra: pip install -e '.[bench]')",
    )
    parser.add_argument(
        "--by-function",
        type=int,
        metavar="N",
        help="also print the N PostgreSQL functions through which most of a call's and most of a "
        "run's instructions pass (needs two --batch sizes; see bench/by_function.py)",
    )
    args = parser.parse_args(argv)
    if args.by_function is not None and (args.by_function < 1 or len(set(args.batch)) < 2):
        parser.error("--by-function needs N >= 1 and two --batch sizes (it splits per call and per run)")
    if shutil.which("valgrind") is None:
        sys.exit("bench.instructions: valgrind is not installed (apt-get install valgrind)")
    if args.large <= args.small:
        parser.error("--large must be more than --small")
    if args.peer:
        try:
            import asyncpg  # noqa: F401
            import pgqueuer  # noqa: F401
        except ImportError:
            sys.exit(
                "bench.instructions: PgQueuer is not installed: pip install -e '.[bench]' "
                "(or pass --no-peer to count runrow alone)"
            )
    with tempfile.TemporaryDirectory(prefix="runrow-callgrind-") as scratch:
        # --by-function reads the files; without --keep they go once it has.
        kept = args.keep if args.keep is not None or args.by_function is None else Path(scratch)
        figures = count(args.batch, args.events, args.small, args.large, kept, args.peer)
        for line in report(figures):
            print(line)
        if args.by_function is not None and kept is not None:
            batches = sorted(set(args.batch))
            for line in report_by_function(
                kept, batches, args.events, args.small, args.large, args.peer, args.by_function
            ):
                print(line)
    if args.json is not None:
        args.json.write_text(json.dumps(figures | fixed_and_per_run(figures), indent=2))


if __name__ == "__main__":
    main()
