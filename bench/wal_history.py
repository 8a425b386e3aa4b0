"""WAL per lifecycle with a history in the tables: issue 11's "WAL per lifecycle at most
PgQueuer's, also with 1 M finished runs in the tables".

For runrow (finish_and_claim_runs, bench.drain's one-call row: what `runrow worker` sends) and
PgQueuer (asyncpg, its QueueManager), at each batch size, in a fresh database each:

1. the history: HISTORY jobs enqueued and drained through the system's own calls, in chunks
   (runrow: HISTORY finished runs with their journals; PgQueuer: HISTORY jobs done and
   logged), then VACUUM ANALYZE, as autovacuum would have left them;
2. JOBS more jobs enqueued, VACUUM ANALYZE, then a CHECKPOINT;
3. the JOBS drained by 2 processes, counting WAL bytes, WAL records and full-page images per
   job (pg_stat_wal and the WAL position); then 2 and 3 again for the next batch size, whose
   history holds the previous batch's jobs too; every job checked done once at the end
   (bench.drain's checks).

Unlike bench.drain's cluster, this one runs with full_page_writes on, as a production server
does: the first change of a page after a checkpoint logs the whole page, and that is where a
history can cost WAL (an insert into an index of a million entries lands on a leaf page nobody
has touched since the checkpoint). Autovacuum is off while a drain is counted, so the WAL is
the drain's own, not a vacuum's that happened to run then. Right after a CHECKPOINT is the
worst case: a server pays each page's image once per checkpoint cycle, so the more jobs a
cycle holds, the less of it each job carries. The report gives both histories per system, and
each system's figure over PgQueuer's at the same history.

`python -m bench.wal_history --help`; `make bench` runs it at its defaults (HISTORY 1,000 and
1,000,000; on 2 cores the million-run fill is about 15 minutes for runrow).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.common import ON_A_CLUSTER, cli, fsync_cluster, machine, migrate, temporary_database
from bench.drain import (
    Counters,
    counters,
    drain,
    pgqueuer_check,
    pgqueuer_enqueue,
    pgqueuer_setup,
    pgqueuer_worker,
    runrow_check,
    runrow_enqueue,
    runrow_one_call_worker,
)

RUNROW = "runrow SQL API (finish_and_claim_runs)"
PGQUEUER = "PgQueuer 1.6 (asyncpg, QueueManager)"
HISTORIES = (1_000, 1_000_000)
JOBS = 20_000
BATCHES = (1, 10)
FILL_CHUNK = 50_000  # jobs enqueued and drained per step of the history's fill
FILL_BATCH = 1_000  # the fill's claim size: the history is not what is measured


class System(NamedTuple):
    install: Callable[[str, int], None]  # an empty database made ready, with its first jobs
    enqueue: Callable[[str, int], None]  # more jobs
    worker: Callable[[str, int, Callable[[], None]], int]
    check: Callable[[str, int], None]  # every job of the database done exactly once


def systems(time_ordered: bool, request_chars: int | None = None) -> dict[str, System]:
    """Each system's calls; runrow's conversation ids random (version 4, as any client's might
    be) or time-ordered (version 7, as runrow's own clients mint them). With `request_chars`,
    each job carries a request of that many characters: runrow's user message, PgQueuer's
    payload (bytes); without, runrow's is "job" and PgQueuer's none, as in bench.drain."""
    content = "job" if request_chars is None else "x" * request_chars
    payload = None if request_chars is None else b"x" * request_chars

    def runrow_install(url: str, jobs: int) -> None:
        migrate(url)
        runrow_enqueue(url, jobs, time_ordered, content)

    def runrow_more(url: str, jobs: int) -> None:
        runrow_enqueue(url, jobs, time_ordered, content)

    def pgqueuer_install(url: str, jobs: int) -> None:
        pgqueuer_setup(url, jobs, payload)

    def pgqueuer_more(url: str, jobs: int) -> None:
        pgqueuer_enqueue(url, jobs, payload)

    return {
        RUNROW: System(runrow_install, runrow_more, runrow_one_call_worker, runrow_check),
        PGQUEUER: System(pgqueuer_install, pgqueuer_more, pgqueuer_worker, pgqueuer_check),
    }


@dataclasses.dataclass
class Row:
    system: str
    batch: int
    history: int
    jobs: int
    wal_bytes: int
    wal_records: int
    wal_fpi: int
    # Full-page images by the relation whose page they hold (pg_walinspect), most first.
    fpi_by_relation: dict[str, int] = dataclasses.field(default_factory=dict)

    def per_job(self, field: str) -> float:
        return getattr(self, field) / self.jobs

    def images(self, top: int = 4) -> str:
        """The relations with the most full-page images, per job."""
        return ", ".join(
            f"{name} {n / self.jobs:.3f}" for name, n in list(self.fpi_by_relation.items())[:top]
        )

    def cells(self) -> str:
        return (
            f"{self.per_job('wal_bytes'):8,.0f} B WAL/job  {self.per_job('wal_records'):6.2f} records/job"
            f"  {self.per_job('wal_fpi'):6.3f} full-page images/job"
        )


def fill(system: System, url: str, history: int, progress: Callable[[str], None]) -> None:
    """`history` jobs through the system's own calls, FILL_CHUNK at a time: enqueued, then
    drained by 2 processes claiming FILL_BATCH at a time."""
    started, done = time.monotonic(), 0
    system.install(url, min(history, FILL_CHUNK))
    while True:
        chunk = min(history - done, FILL_CHUNK)
        drained, _, _ = drain(system.worker, url, FILL_BATCH)
        assert sum(drained) == chunk, f"the fill drained {sum(drained)} of {chunk}"
        done += chunk
        if history > FILL_CHUNK:
            progress(f"    history {done:,} of {history:,} ({time.monotonic() - started:.0f} s)")
        if done == history:
            break
        system.enqueue(url, min(history - done, FILL_CHUNK))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def images_by_relation(observer: psycopg.Connection, url: str, start: str, end: str) -> dict[str, int]:
    """Full-page images in the WAL from start to end, by the relation of the bench database
    whose page each holds (other databases' and unknown files are left out), most first. Read
    with pg_walinspect in the observer's database; the drain's commits have flushed the WAL."""
    observer.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    counted = observer.execute(
        "SELECT m[1]::oid, m[2]::oid, count(*) FROM pg_get_wal_records_info(%s, %s) AS w,"
        r" regexp_matches(w.block_ref, 'rel \d+/(\d+)/(\d+) fork main blk \d+ \(FPW\)', 'g') AS m"
        " GROUP BY 1, 2",
        (start, end),
    ).fetchall()
    with psycopg.connect(url) as conn:
        me = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
        names = dict(
            conn.execute(
                "SELECT pg_relation_filenode(c.oid), c.relname FROM pg_class AS c"
                " WHERE pg_relation_filenode(c.oid) IS NOT NULL"
            ).fetchall()
        )
    mine = [(names[node], n) for db, node, n in counted if db == me and node in names]
    return dict(sorted(mine, key=lambda pair: -pair[1]))


def measure(
    server: str,
    superuser: str,
    name: str,
    system: System,
    batches: list[int],
    history: int,
    jobs: int,
    progress: Callable[[str], None],
) -> list[Row]:
    """One database: the history, then per batch size `jobs` more jobs drained and counted (the
    next batch's history holds the previous batch's jobs too)."""
    rows: list[Row] = []
    with temporary_database(server, "runrow_bench_wal", migrated=False) as url:
        fill(system, url, history, progress)
        datname = conninfo_to_dict(url)["dbname"]
        for batch in batches:
            system.enqueue(url, jobs)
            with psycopg.connect(make_conninfo(superuser, dbname="postgres"), autocommit=True) as observer:
                observer.execute("ALTER SYSTEM SET autovacuum = off")
                observer.execute("SELECT pg_reload_conf()")
                try:
                    # A temporary slot keeps the WAL read back below until this session ends: a
                    # checkpoint during a slow drain (checkpoint_timeout) would otherwise recycle
                    # its first segments ("requested WAL segment ... has already been removed").
                    observer.execute("SELECT pg_create_physical_replication_slot(%s, true, true)", (datname,))
                    observer.execute("CHECKPOINT")
                    start = observer.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
                    before = counters(observer, datname)
                    drained, _, _ = drain(system.worker, url, batch)
                    spent: Counters = counters(observer, datname).since(before)
                    # pg_walinspect reads up to the flushed position; the drain's commits flushed it all.
                    end = observer.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
                    images = images_by_relation(observer, url, start, end)
                finally:
                    observer.execute("ALTER SYSTEM RESET autovacuum")
                    observer.execute("SELECT pg_reload_conf()")
            assert sum(drained) == jobs, f"{name}: {sum(drained)} jobs drained of {jobs}"
            done_before = history + len(rows) * jobs
            row = Row(
                name, batch, done_before, jobs, spent.wal_bytes, spent.wal_records, spent.wal_fpi, images
            )
            rows.append(row)
            progress(f"    batch {batch}, {done_before:,} done before: {row.cells()}")
            progress(f"      full-page images per job: {row.images()}")
        system.check(url, history + len(batches) * jobs)
    return rows


def report(
    rows: list[Row],
    wal_compression: str = "off",
    time_ordered: bool = False,
    request_chars: int | None = None,
) -> list[str]:
    ids = "time-ordered" if time_ordered else "random"
    request = "" if request_chars is None else f"; a request of {request_chars:,} characters per job"
    lines = [
        "=== WAL per job with a history, right after a CHECKPOINT"
        f" (full_page_writes on, wal_compression {wal_compression};"
        f" runrow's conversation ids {ids}{request}) ==="
    ]
    for row in rows:
        label = f"{row.system}, batch {row.batch}, {row.history:,} done before"
        lines.append(f"  {label:<72}{row.cells()}")
        lines.append(f"      full-page images per job: {row.images()}")
    peers = {(r.batch, r.history): r for r in rows if r.system == PGQUEUER}  # same histories: same order
    ours = [r for r in rows if r.system == RUNROW]
    if peers and ours:
        lines.append("=== runrow / PgQueuer, WAL bytes per job (issue 11: at most 1.00x, also with 1 M) ===")
        for row in ours:
            peer = peers.get((row.batch, row.history))
            if peer is not None:
                ratio = row.wal_bytes / max(peer.wal_bytes, 1)
                lines.append(f"  batch {row.batch}, {row.history:>9,} done before: {ratio:5.2f}x")
    for name in (RUNROW, PGQUEUER):
        for batch in sorted({r.batch for r in rows}):
            mine = sorted((r for r in rows if r.system == name and r.batch == batch), key=lambda r: r.history)
            if len(mine) >= 2:
                small, large = mine[0], mine[-1]
                growth = large.wal_bytes / max(small.wal_bytes, 1)
                sizes = f"{large.history:,} done before / {small.history:,}"
                lines.append(f"  {name.split(' (')[0]}, batch {batch}: {sizes}: {growth:5.2f}x")
    return lines


def run(
    histories: list[int],
    jobs: int,
    batches: list[int],
    with_peer: bool,
    wal_compression: str = "off",
    time_ordered: bool = False,
    request_chars: int | None = None,
) -> tuple[list[str], list[Row]]:
    names = [RUNROW, PGQUEUER] if with_peer else [RUNROW]
    calls = systems(time_ordered, request_chars)
    rows: list[Row] = []
    with fsync_cluster(full_page_writes=True) as (server, superuser):
        with psycopg.connect(make_conninfo(superuser, dbname="postgres"), autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET wal_compression = '{wal_compression}'")
            conn.execute("SELECT pg_reload_conf()")
        for history in histories:
            for name in names:
                print(f"  {name}, {history:,} done before ...", flush=True)
                rows += measure(
                    server,
                    superuser,
                    name,
                    calls[name],
                    batches,
                    history,
                    jobs,
                    lambda m: print(m, flush=True),
                )
        lines = [*report(rows, wal_compression, time_ordered, request_chars), machine(server)]
    return lines, rows


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = cli(
        "bench.wal_history",
        "WAL per job of a drain (runrow's finish_and_claim_runs and PgQueuer, 2 processes) "
        "with HISTORY jobs already done in the tables, right after a CHECKPOINT, on a private cluster "
        "with fsync and full_page_writes on; prints WAL bytes, records and full-page images per job, "
        "and runrow over PgQueuer.",
        ON_A_CLUSTER,
    )
    parser.add_argument(
        "--history",
        type=int,
        nargs="+",
        default=list(HISTORIES),
        metavar="N",
        help="jobs done before the counted drain, one database each (default 1000 1000000)",
    )
    parser.add_argument(
        "--jobs", type=int, default=JOBS, metavar="N", help=f"jobs counted (default {JOBS:,})"
    )
    parser.add_argument(
        "--batch",
        type=int,
        nargs="+",
        default=list(BATCHES),
        metavar="B",
        help="claim sizes: runrow's max_runs, PgQueuer's batch_size (default 1 10)",
    )
    parser.add_argument(
        "--peer", action=argparse.BooleanOptionalAction, default=True, help="also count PgQueuer (default on)"
    )
    parser.add_argument(
        "--wal-compression",
        choices=("off", "pglz", "lz4"),
        default="off",
        help="the cluster's wal_compression, which compresses full-page images (default off, "
        "PostgreSQL's default)",
    )
    parser.add_argument(
        "--conversation-ids",
        choices=("random", "time-ordered"),
        default="random",
        help="runrow's conversation ids: random (version 4, as any client's might be; the default) or "
        "time-ordered (version 7, as runrow's own clients mint them)",
    )
    parser.add_argument(
        "--request-chars",
        type=int,
        metavar="N",
        help="each job carries a request of N characters: runrow's user message, PgQueuer's payload "
        "(default: runrow's \"job\", PgQueuer's none, as in bench.drain)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the rows to PATH")
    args = parser.parse_args(argv)
    if any(h < 1 for h in args.history):
        parser.error("--history needs N >= 1 (every database gets its first jobs through the system's calls)")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if any(not 1 <= b <= 1000 for b in args.batch):
        parser.error("--batch sizes must be between 1 and 1000")
    if args.request_chars is not None and not 0 <= args.request_chars <= 1_000_000:
        parser.error("--request-chars must be between 0 and 1000000")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    lines, rows = run(
        sorted(set(args.history)),
        args.jobs,
        args.batch,
        args.peer,
        args.wal_compression,
        args.conversation_ids == "time-ordered",
        args.request_chars,
    )
    for line in lines:
        print(line)
    path = args.json or os.environ.get("RUNROW_BENCH_JSON")
    if path:
        with open(path, "w") as out:
            json.dump({"report": lines, "rows": [dataclasses.asdict(r) for r in rows]}, out, indent=2)


if __name__ == "__main__":
    main()
