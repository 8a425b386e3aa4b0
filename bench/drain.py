"""Drain throughput side by side: runrow's SQL API against PgQueuer and a bare SQL queue.

JOBS empty jobs are enqueued, then drained by PROCESSES processes, at batch 1 and batch 10,
each row in a fresh database of one cluster (fsync and synchronous_commit on; the private
cluster's full_page_writes is off, so WAL figures carry no full-page images; a CHECKPOINT
before each drain so every row starts at the same point):

- bare SQL: one table, claim = UPDATE ... FOR UPDATE SKIP LOCKED RETURNING, ack = DELETE;
  the ceiling of a claim + ack on this box.
- PgQueuer (asyncpg, its default driver; and psycopg): its own QueueManager in drain mode, a
  no-op entrypoint, its default timeouts and acknowledgement buffering. Ratios are taken
  against the faster PgQueuer row.
- runrow SQL API: claim_runs(max_runs => batch), then one finish_runs for the batch; each
  call its own transaction, every rule of SPEC.md kept (fence, journal, turn order, wakes).
- runrow SQL API chained: the same calls, but a batch's finish_runs and the next batch's
  claim_runs share one transaction (BEGIN, finish, claim in one round trip, then COMMIT): one
  commit per batch instead of two, as a client that asks for more work with its results does.
- runrow SQL API one call: finish_and_claim_runs, a batch's ending and the next batch's claim in
  one call (one UPDATE of agent_run and one journal INSERT instead of two of each), in a
  transaction committed once the rows are in hand; what `runrow worker` sends.
- runrow floor (bench/floor.py): the four writes SPEC.md asks of a run's lifecycle and no rule,
  in one statement per call, prepared and planned once, on a narrow table, then on runrow's own
  tables without and with their triggers: what runrow's writes cost alone, and what its table,
  triggers and functions each add on top (the steps between the rungs and the one-call row).
  A fourth floor row runs the one-call row's functions with the two rule triggers off (the
  writers number the journal): the bound for rules that cost nothing.
- runrow worker: PROCESSES `runrow worker` processes at --concurrency batch, the echo handler,
  zero-length runs (message_start, message_stop, complete), enqueued in one statement once the
  workers wait.
- beside idle LISTEN sessions: the SQL API at batch 10 and the worker at --concurrency 10, each
  with 2 and 20 sessions LISTENing on a channel nobody notifies; PostgreSQL 15 wakes each of them
  (one transaction) on every notifying commit in the database, so commits per job show whether
  a run's cost grows with the fleet's listeners.

Besides jobs/s (wall clock, so it moves with the box's load) it counts what does not depend
on the clock: WAL bytes, WAL records and full-page images per job (pg_stat_wal and the WAL
position), and commits and shared buffers (hit or read) per job (pg_stat_database): the server
work each system pays per job, whatever the box's speed. Every job is checked done exactly once.

And where the CPU goes, per job: the client processes' (from the moment they are connected)
and the whole cluster's (every backend, also those gone by the end, and the WAL writer,
checkpointer and autovacuum), read from /proc (bench/cpu.py; not shown for a server on another
host). On a box the drain saturates, jobs/s is about cores / (client + server) per job, so the
split says which side a system would have to shed to catch up with its peer.

`python -m bench.drain --help` for how to run it alone (its own cluster unless DATABASE_URL is
set and --here is given).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import psycopg

from bench import cpu, floor
from bench.common import ON_A_CLUSTER, cli, fsync_cluster, machine, temporary_database

JOBS = 20_000
SHORT_JOBS = 2_000
PROCESSES = 2
BATCHES = (1, 10)
LISTENERS = (2, 20)  # idle LISTEN connections beside the runrow workers, for the notify-storm rows
ECHO = "pyworker.worker.echo:handle"


@dataclasses.dataclass
class Row:
    system: str
    batch: int
    jobs: int
    seconds: float
    wal_bytes: int
    wal_records: int
    wal_fpi: int
    commits: int
    buffers: int = 0  # shared blocks hit or read by the database's sessions
    round: int = 1
    # CPU seconds of the drain (bench/cpu.py; None where /proc cannot tell): the client
    # processes', and the whole cluster's (backends, WAL writer, checkpointer, autovacuum).
    client_cpu: float | None = None
    server_cpu: float | None = None

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    def cells(self) -> str:
        return (
            f"{self.rate:8,.0f} jobs/s  {self.wal_bytes / self.jobs:7,.0f} B WAL/job  "
            f"{self.wal_records / self.jobs:5.1f} WAL records/job  {self.wal_fpi / self.jobs:5.2f} FPI/job  "
            f"{self.commits / self.jobs:5.2f} commits/job  {self.buffers / self.jobs:6.1f} buffers/job"
            + self.cpu_cells()
        )

    def cpu_cells(self) -> str:
        if self.client_cpu is None or self.server_cpu is None:
            return ""
        client, server = (self.client_cpu / self.jobs * 1e6, self.server_cpu / self.jobs * 1e6)
        return f"  CPU/job {client:4,.0f} + {server:4,.0f} us (client + server)"

    @property
    def cpu(self) -> float | None:
        """CPU seconds per job, client and server together; None without both."""
        if self.client_cpu is None or self.server_cpu is None:
            return None
        return (self.client_cpu + self.server_cpu) / self.jobs


# --- the three systems: setup(url, jobs), then worker(url, batch) in each process, then check


def bare_setup(url: str, jobs: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE job (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " status text NOT NULL DEFAULT 'queued', payload bytea, picked_at timestamptz)"
        )
        conn.execute("CREATE INDEX job_queued ON job (id) WHERE status = 'queued'")
        conn.execute("CREATE TABLE job_done (id bigint PRIMARY KEY)")
        conn.execute("INSERT INTO job (payload) SELECT NULL FROM generate_series(1, %s)", (jobs,))
        conn.execute("VACUUM ANALYZE job")


def bare_worker(url: str, batch: int, ready: Callable[[], None]) -> int:
    done = 0
    with psycopg.connect(url, autocommit=True) as conn:
        ready()
        while True:
            ids = [
                r[0]
                for r in conn.execute(
                    "UPDATE job SET status = 'picked', picked_at = now() WHERE id IN ("
                    " SELECT id FROM job WHERE status = 'queued' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)"
                    " RETURNING id",
                    (batch,),
                ).fetchall()
            ]
            if not ids:
                return done
            conn.execute(
                "WITH d AS (DELETE FROM job WHERE id = ANY (%s) RETURNING id)"
                " INSERT INTO job_done SELECT id FROM d",
                (ids,),
            )
            done += len(ids)


def bare_check(url: str, jobs: int) -> None:
    with psycopg.connect(url) as conn:
        left, done = conn.execute(
            "SELECT (SELECT count(*) FROM job), (SELECT count(*) FROM job_done)"
        ).fetchone()
    assert (left, done) == (0, jobs), f"bare SQL: {left} jobs left, {done} done of {jobs}"


def pgqueuer_setup(url: str, jobs: int, payload: bytes | None = None) -> None:
    asyncio.run(_pgqueuer_setup(url, jobs, payload=payload))


async def _pgqueuer_setup(url: str, jobs: int, install: bool = True, payload: bytes | None = None) -> None:
    from pgqueuer import PsycopgDriver, Queries

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        queries = Queries(PsycopgDriver(conn))
        if install:
            await queries.install()
        for start in range(0, jobs, 5000):
            n = min(5000, jobs - start)
            await queries.enqueue(["noop"] * n, [payload] * n, [0] * n)
        await conn.execute("VACUUM ANALYZE")


def pgqueuer_enqueue(url: str, jobs: int, payload: bytes | None = None) -> None:
    """`jobs` more jobs in a database pgqueuer_setup has installed, each with `payload`."""
    asyncio.run(_pgqueuer_setup(url, jobs, install=False, payload=payload))


def pgqueuer_worker(
    url: str, batch: int, ready: Callable[[], None], backend_pid: Callable[[int], None] | None = None
) -> int:
    return asyncio.run(_pgqueuer_worker(url, batch, ready, "asyncpg", backend_pid))


def pgqueuer_psycopg_worker(url: str, batch: int, ready: Callable[[], None]) -> int:
    return asyncio.run(_pgqueuer_worker(url, batch, ready, "psycopg"))


async def _pgqueuer_worker(
    url: str,
    batch: int,
    ready: Callable[[], None],
    driver: str,
    backend_pid: Callable[[int], None] | None = None,
) -> int:
    """PgQueuer as its own benchmark (tools/benchmark.py, drain strategy) drives it: one
    connection per QueueManager, drain mode, its default timeouts and ack buffering. asyncpg
    is its default driver and the peer the ratios use. Its psycopg driver is shown beside it
    but is no fair peer at batch 10: its LISTEN watcher holds the connection's lock in
    `notifies(timeout=1.0, stop_after=1)` until a notification arrives, and every query of
    the queue manager waits behind it (measured: 350 jobs/s against asyncpg's 2,531).
    backend_pid, when given, is told the server pid of that connection (bench.instructions
    counts that backend's instructions)."""
    from pgqueuer import AsyncpgDriver, PsycopgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    done = 0
    async with contextlib.AsyncExitStack() as stack:
        if driver == "asyncpg":
            import asyncpg
            from psycopg.conninfo import conninfo_to_dict

            params = conninfo_to_dict(url)
            conn = await asyncpg.connect(
                host=params.get("host"),
                port=params.get("port"),
                user=params.get("user"),
                password=params.get("password"),
                database=params.get("dbname"),
            )
            stack.push_async_callback(conn.close)
            if backend_pid is not None:
                backend_pid(conn.get_server_pid())
            queries = Queries(AsyncpgDriver(conn))
        else:
            pconn = await stack.enter_async_context(
                await psycopg.AsyncConnection.connect(url, autocommit=True)
            )
            if backend_pid is not None:
                backend_pid(pconn.info.backend_pid)
            queries = Queries(PsycopgDriver(pconn))
        qm = QueueManager(queries)

        @qm.entrypoint("noop")
        async def noop(job: object) -> None:
            nonlocal done
            done += 1

        ready()
        await qm.run(batch_size=batch, mode=QueueExecutionMode.drain)
    return done


def pgqueuer_check(url: str, jobs: int) -> None:
    with psycopg.connect(url) as conn:
        left = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()[0]
        done = conn.execute("SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'").fetchone()[0]
    assert (left, done) == (0, jobs), f"PgQueuer: {left} jobs left, {done} logged successful of {jobs}"


def runrow_setup(url: str, jobs: int) -> None:
    """`url` is migrated already (drain_row: a copy of the migrated template)."""
    runrow_enqueue(url, jobs)


def runrow_enqueue(url: str, jobs: int, time_ordered: bool = False, content: str = "job") -> None:
    """`jobs` runs, one conversation each, in a migrated database, each asking `content`; the
    conversation ids random (version 4, as any client's might be) or time-ordered (version 7, as
    runrow's clients mint them; made by runrow's own `_uuidv7`, which the bench's owner role may
    call)."""
    conversation = "runrow._uuidv7()" if time_ordered else "gen_random_uuid()"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"SELECT runrow.enqueue_run({conversation}, %s::jsonb, 'bench') FROM generate_series(1, %s)",
            (json.dumps(content), jobs),
        )
        conn.execute("VACUUM ANALYZE")


_CLAIM = "SELECT run_id, claim_token FROM runrow.claim_runs(worker_id => 'bench', max_runs => %s)"
_FINISH = "SELECT finished FROM runrow.finish_runs(%s::jsonb)"


def acks(runs: list[tuple[Any, ...]], events: list[dict[str, Any]] | None = None) -> str:
    """finish_runs' argument: every claimed run (run_id, claim_token) completed, each with
    `events` journaled before its complete when given (bench.instructions: a zero-length
    answer's message_start and message_stop)."""
    extra = {"events": events} if events else {}
    return json.dumps(
        [{"run_id": str(r), "claim_token": str(t), "status": "completed", **extra} for r, t in runs]
    )


def runrow_worker(url: str, batch: int, ready: Callable[[], None]) -> int:
    done = 0
    with psycopg.connect(url, autocommit=True) as conn:
        ready()
        while True:
            runs = conn.execute(_CLAIM, (batch,)).fetchall()
            if not runs:
                return done
            finished = conn.execute(_FINISH, (acks(runs),)).fetchall()
            assert all(f for (f,) in finished), "a run held by this worker was fenced out"
            done += len(finished)


def runrow_chained_worker(url: str, batch: int, ready: Callable[[], None]) -> int:
    """The batch's finish_runs and the next batch's claim_runs in one transaction: one commit
    per batch, not two. BEGIN, the finish and the claim go in one simple query (parameters bound
    client-side); the COMMIT follows once the claimed rows are in hand, so a COMMIT that goes
    unanswered can be settled by the fence (as pyworker's begin_claim_runs does)."""
    done = 0
    with psycopg.connect(url, autocommit=True) as conn, psycopg.ClientCursor(conn) as cur:
        ready()
        runs = cur.execute(_CLAIM, (batch,)).fetchall()
        while runs:
            cur.execute(f"BEGIN; {_FINISH}; {_CLAIM}", (acks(runs), batch))
            cur.nextset()  # past BEGIN's result
            finished = cur.fetchall()
            assert len(finished) == len(runs) and all(f for (f,) in finished), "a held run was fenced out"
            cur.nextset()
            runs = cur.fetchall()
            conn.commit()
            done += len(finished)
    return done


FINISH_AND_CLAIM = (
    "SELECT run_id, finished, claim_token"
    " FROM runrow.finish_and_claim_runs(%s::jsonb, worker_id => 'bench', max_runs => %s)"
)


def runrow_one_call_worker(url: str, batch: int, ready: Callable[[], None]) -> int:
    """A batch's ending and the next batch's claim in one call, finish_and_claim_runs (one UPDATE
    and one journal INSERT for both), in a transaction committed once the rows are in hand, as
    pyworker's begin_finish_runs_and_claim does."""
    done = 0
    with psycopg.connect(url, autocommit=True) as conn, psycopg.ClientCursor(conn) as cur:
        ready()
        runs = cur.execute(_CLAIM, (batch,)).fetchall()
        while runs:
            cur.execute(f"BEGIN; {FINISH_AND_CLAIM}", (acks(runs), batch))
            cur.nextset()  # past BEGIN's result
            rows = cur.fetchall()
            conn.commit()
            finished = [f for _, f, _ in rows if f is not None]
            assert len(finished) == len(runs) and all(finished), "a held run was fenced out"
            runs = [(r, t) for r, f, t in rows if f is None]
            done += len(finished)
    return done


def runrow_check(url: str, jobs: int) -> None:
    with psycopg.connect(url) as conn:
        runs = conn.execute(
            "SELECT r.status, r.attempt, count(*) FILTER (WHERE e.type = 'run_claimed'),"
            " count(*) FILTER (WHERE e.type = 'complete'), count(*) OVER ()"
            " FROM runrow.agent_run AS r JOIN runrow.run_event AS e ON e.run_id = r.id GROUP BY r.id"
        ).fetchall()
        broken = conn.execute("SELECT count(*) FROM runrow.audit()").fetchone()[0]
    shapes = {row[:4] for row in runs}
    assert len(runs) == jobs and shapes == {("completed", 1, 1, 1)}, (
        f"runrow: {len(runs)} runs, shapes {shapes}: every run must be completed once, claimed once"
    )
    assert broken == 0, f"runrow: audit() reports {broken} problems"


# --- the reference worker itself: `runrow worker` processes, echo handler, zero-length runs

# %s zero-length runs for the echo handler, one conversation each (also bench.instructions').
ECHO_ENQUEUE = (
    "SELECT count(*) FROM (SELECT runrow.enqueue_run(conversation_id => gen_random_uuid(),"
    ' content => \'"job"\', model => \'echo\', metadata => \'{"echo": "", "duration": 0}\')'
    " FROM generate_series(1, %s)) AS e"
)


@contextlib.contextmanager
def runrow_workers(url: str, concurrency: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """PROCESSES `runrow worker` processes on an empty queue, each started (its claim loop
    waiting on runrow_enqueued); SIGTERM (a drain) and exit 0 at the end."""
    logs = [tempfile.TemporaryFile() for _ in range(PROCESSES)]
    cmd = [sys.executable, "-m", "pyworker", "worker", "--handler", ECHO, "--concurrency", str(concurrency)]
    cmd += ["--poll", "1", "--reap-interval", "3600", "--trim-after", "0", "--lease", "60"]
    procs = [
        subprocess.Popen(
            [*cmd, "--worker-id", f"bench-{i}"],
            env={**os.environ, "DATABASE_URL": url},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        for i, log in enumerate(logs)
    ]

    def output(i: int) -> str:
        logs[i].seek(0)
        return logs[i].read().decode(errors="replace")

    try:
        deadline = time.monotonic() + 120
        for i in range(PROCESSES):
            while f"worker bench-{i} started" not in output(i):
                assert procs[i].poll() is None, f"runrow worker bench-{i} exited:\n{output(i)}"
                assert time.monotonic() < deadline, f"runrow worker bench-{i} did not start:\n{output(i)}"
                time.sleep(0.05)
        yield procs
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for i, proc in enumerate(procs):
            assert proc.wait(60) == 0, f"runrow worker bench-{i} exited {proc.returncode}:\n{output(i)}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()


def wait_gone(observer: psycopg.Connection, datname: str, others: int) -> None:
    """Wait until at most `others` sessions are left in the database."""
    while observer.execute(
        "SELECT count(*) > %s FROM pg_stat_activity WHERE datname = %s", (others, datname)
    ).fetchone()[0]:
        time.sleep(0.05)


def settled(observer: psycopg.Connection, datname: str, others: int) -> Counters:
    """counters() once at most `others` sessions are left in the database and its commit count
    has stopped moving: a backend flushes its statistics as it exits, after it has left
    pg_stat_activity."""
    wait_gone(observer, datname, others)
    last = counters(observer, datname)
    while True:
        time.sleep(0.3)
        now = counters(observer, datname)
        if now.commits == last.commits:
            return now
        last = now


@contextlib.contextmanager
def idle_listeners(url: str, n: int) -> Iterator[None]:
    """n sessions LISTENing on a channel nobody notifies: PostgreSQL 15 still signals each on
    every notifying commit in the database, and each then runs a transaction to read the queue."""
    idle = [psycopg.connect(url, autocommit=True) for _ in range(n)]
    try:
        for conn in idle:
            conn.execute("LISTEN runrow_bench_idle")
        yield
    finally:
        for conn in idle:
            conn.close()


def worker_row(server: str, superuser: str, concurrency: int, jobs: int, listeners: int = 0) -> Row:
    """The drain by `runrow worker` processes at --concurrency `concurrency`, with `listeners`
    idle LISTEN sessions in the database beside them. The jobs are enqueued in one statement
    once the workers are up; the clock runs from its commit to the last run completed."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = f"runrow worker (--concurrency {concurrency})"
    if listeners:
        name = f"runrow worker c{concurrency} + {listeners} idle LISTEN"
    with temporary_database(server, "runrow_bench_drain") as url:
        datname = conninfo_to_dict(url)["dbname"]
        as_super = make_conninfo(superuser, dbname=datname)
        with (
            idle_listeners(url, listeners),
            psycopg.connect(make_conninfo(superuser, dbname="postgres"), autocommit=True) as observer,
            runrow_workers(url, concurrency) as workers,
            psycopg.connect(as_super, autocommit=True) as poll,
        ):
            root = postmaster(observer)
            observer.execute("CHECKPOINT")
            poll.execute(ECHO_ENQUEUE, (jobs,))
            started = time.monotonic()
            poll.execute("SELECT pg_stat_force_next_flush()")  # the enqueue's commit is not the drain's
            before = counters(observer, datname)
            server_before = _server_cpu(root)
            client_before = [cpu.process_seconds(proc.pid) for proc in workers]
            polls = 0
            while True:
                polls += 1
                left = poll.execute(
                    "SELECT EXISTS (SELECT 1 FROM runrow.agent_run WHERE status = 'queued')"
                    " OR EXISTS (SELECT 1 FROM runrow.agent_run WHERE status = 'running')"
                ).fetchone()[0]
                if not left:
                    break
                time.sleep(0.02)
            seconds = time.monotonic() - started
            # Before the SIGTERM: a worker's drain and exit are not the runs'.
            client_after = [cpu.process_seconds(proc.pid) for proc in workers]
            poll.execute("SELECT pg_stat_force_next_flush()")
            polls += 1
        with psycopg.connect(make_conninfo(superuser, dbname="postgres"), autocommit=True) as observer:
            after = settled(observer, datname, others=0)
            server_cpu = _spent(_server_cpu(root), server_before)
        runrow_check(url, jobs)
        spent = after.since(before)
        client = [_spent(a, b) for a, b in zip(client_after, client_before, strict=True)]
        return Row(
            name,
            concurrency,
            jobs,
            seconds,
            **spent._replace(commits=spent.commits - polls)._asdict(),
            client_cpu=None if None in client else sum(c for c in client if c is not None),
            server_cpu=server_cpu,
        )


Worker = Callable[[str, int, Callable[[], None]], int]
SYSTEMS: dict[str, tuple[Callable[[str, int], None], Worker, Callable[[str, int], None]]] = {
    "bare SQL (claim UPDATE, ack DELETE)": (bare_setup, bare_worker, bare_check),
    "PgQueuer 1.6 (asyncpg, QueueManager)": (pgqueuer_setup, pgqueuer_worker, pgqueuer_check),
    "PgQueuer 1.6 (psycopg, QueueManager)": (pgqueuer_setup, pgqueuer_psycopg_worker, pgqueuer_check),
    "runrow SQL API (claim_runs -> finish_runs)": (runrow_setup, runrow_worker, runrow_check),
    "runrow SQL API (finish_runs + next claim_runs)": (runrow_setup, runrow_chained_worker, runrow_check),
    "runrow SQL API (finish_and_claim_runs)": (runrow_setup, runrow_one_call_worker, runrow_check),
}
# The rows whose database holds no runrow schema.
FOREIGN_SCHEMA = {
    "bare SQL (claim UPDATE, ack DELETE)",
    "PgQueuer 1.6 (asyncpg, QueueManager)",
    "PgQueuer 1.6 (psycopg, QueueManager)",
}
# The "peers" rows; the floor's are their own group (--only floor).
PEER_SYSTEMS = tuple(SYSTEMS)
SYSTEMS.update(floor.systems())
FOREIGN_SCHEMA |= {floor.NARROW}
FLOOR_SYSTEMS = tuple(name for name in SYSTEMS if name not in PEER_SYSTEMS)
RUNROW_API = "runrow SQL API (claim_runs -> finish_runs)"
RUNROW_CHAINED = "runrow SQL API (finish_runs + next claim_runs)"
RUNROW_ONE_CALL = "runrow SQL API (finish_and_claim_runs)"


class Counters(NamedTuple):
    """What a row counts instead of timing it: the WAL position (bytes), WAL records and
    full-page images, and the commits and shared buffers (hit or read) of one database. Field
    names are Row's, so a difference of two readings is a row's counts."""

    wal_bytes: int
    wal_records: int
    wal_fpi: int
    commits: int
    buffers: int

    def since(self, before: Counters) -> Counters:
        return Counters(*(now - then for now, then in zip(self, before, strict=True)))


def counters(observer: psycopg.Connection, datname: str) -> Counters:
    """The cluster's WAL counters and database `datname`'s commits and buffers. The observer
    sits in another database, so its own statements are not counted; the workers' statistics
    are flushed when their processes exit."""
    observer.execute("SELECT pg_stat_clear_snapshot()")
    row = observer.execute(
        "SELECT pg_current_wal_lsn() - '0/0', w.wal_records, w.wal_fpi, d.xact_commit,"
        " d.blks_hit + d.blks_read FROM pg_stat_wal AS w, pg_stat_database AS d WHERE d.datname = %s",
        (datname,),
    ).fetchone()
    assert row is not None
    return Counters(*(int(v) for v in row))


def _process(worker: Worker, url: str, batch: int, barrier: Any, results: Any) -> None:
    """One drain process: (jobs done, its CPU seconds from the barrier on), or the error."""
    started = [0.0]

    def ready() -> None:
        barrier.wait()
        started[0] = cpu.own_seconds()  # imports and connecting are not the drain's

    try:
        done = worker(url, batch, ready)
        results.put((done, cpu.own_seconds() - started[0]))
    except BaseException as exc:  # handed to the parent, which raises it
        results.put(RuntimeError(f"worker failed: {exc!r}"))
        raise


def drain(worker: Worker, url: str, batch: int) -> tuple[list[int], float, float]:
    """Run the workers in PROCESSES processes; time from the moment all are connected and
    ready (a barrier) to the moment the last one reports the queue empty. Returns the jobs
    each did, the seconds, and the CPU seconds the processes spent from the barrier on."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES + 1)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_process, args=(worker, url, batch, barrier, results)) for _ in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    barrier.wait(timeout=120)
    started = time.monotonic()
    outcomes = [results.get(timeout=1800) for _ in procs]
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    seconds = time.monotonic() - started
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0, f"a worker process exited {proc.exitcode}"
    return [done for done, _ in outcomes], seconds, sum(spent for _, spent in outcomes)


def postmaster(observer: psycopg.Connection) -> int | None:
    """The pid of the observer's postmaster, if it runs on this host (bench/cpu.py): a server
    elsewhere has no such process here, or (its pid taken here by chance) none named postgres."""
    row = observer.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    if cpu.command(row[0]) != "postgres":
        return None
    root = cpu.parent_of(row[0])
    return root if root is not None and cpu.command(root) == "postgres" else None


def _server_cpu(root: int | None) -> float | None:
    return None if root is None else cpu.tree_seconds(root)


def _spent(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


def drain_row(server: str, superuser: str, system: str, batch: int, jobs: int, listeners: int = 0) -> Row:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    setup, worker, check = SYSTEMS[system]
    # runrow's rows start from a copy of a migrated template (devdb.migrated_template): the same
    # database a migrate makes, in 0.06 s instead of about 2 s per row.
    migrated = system not in FOREIGN_SCHEMA
    with temporary_database(server, "runrow_bench_drain", migrated=migrated) as url:
        setup(url, jobs)
        datname = conninfo_to_dict(url)["dbname"]
        with psycopg.connect(make_conninfo(superuser, dbname="postgres"), autocommit=True) as observer:
            root = postmaster(observer)
            with idle_listeners(url, listeners):
                observer.execute("CHECKPOINT")
                before = counters(observer, datname)
                server_before = _server_cpu(root)
                done, seconds, client_cpu = drain(worker, url, batch)
            # Idle sessions flush their statistics when they exit, not after each wake.
            after = settled(observer, datname, others=0) if listeners else counters(observer, datname)
            wait_gone(observer, datname, others=0)  # a backend's CPU is all there once it has gone
            server_cpu = _spent(_server_cpu(root), server_before)
        check(url, jobs)
        assert sum(done) == jobs, f"{system}: the workers report {sum(done)} jobs done of {jobs}"
        return Row(
            f"{system.split(' (')[0]} b{batch} + {listeners} idle LISTEN" if listeners else system,
            batch,
            jobs,
            seconds,
            **after.since(before)._asdict(),
            client_cpu=client_cpu,
            server_cpu=server_cpu,
        )


@contextlib.contextmanager
def bench_cluster() -> Iterator[tuple[str, str]]:
    """(owner URL, superuser URL) of the cluster to run on: our own fsync-on cluster, or
    DATABASE_URL's server with --here (its role must be able to CHECKPOINT)."""
    if "--here" in sys.argv[1:] and os.environ.get("DATABASE_URL"):
        url = os.environ["DATABASE_URL"]
        yield url, os.environ.get("RUNROW_SUPERUSER_URL", url)
        return
    with fsync_cluster() as urls:
        yield urls


def _ratio_lines(rows: list[Row], batch: int) -> list[str]:
    """Each runrow row against the faster PgQueuer row of its own round: jobs/s, WAL, commits
    and buffers as ratios, CPU per job (client + server) when both rows have it, and jobs/s
    against bare SQL. Over several rounds, the median of each ratio with its range (one drain
    moves with the box's load by 30% and more; the median of rounds run alternately is the
    figure to quote)."""
    rounds = sorted({r.round for r in rows})
    per_round: dict[str, list[tuple[float, float, float, float, float, float]]] = {}
    peer_name = ""
    for n in rounds:
        by = {r.system: r for r in rows if r.round == n}
        peers = [r for name, r in by.items() if name.startswith("PgQueuer")]
        bare = next((r for name, r in by.items() if name.startswith("bare")), None)
        if not peers or bare is None:
            return []  # --only without the peers: no ratios
        peer = max(peers, key=lambda r: r.rate)
        peer_name = peer.system
        mine = (
            ("runrow SQL API", by.get(RUNROW_API)),
            ("runrow SQL API chained", by.get(RUNROW_CHAINED)),
            ("runrow SQL API one call", by.get(RUNROW_ONE_CALL)),
            ("runrow worker", by.get(f"runrow worker (--concurrency {batch})")),
            ("runrow floor, narrow table", by.get(floor.NARROW)),
            ("runrow floor, its tables", by.get(floor.TABLES)),
            ("runrow floor, its tables and triggers", by.get(floor.TRIGGERS)),
            ("runrow floor, its functions without rule triggers", by.get(floor.FUNCTIONS)),
        )
        for label, runrow in mine:
            if runrow is not None:
                per_round.setdefault(label, []).append(
                    (
                        runrow.rate / peer.rate,
                        runrow.wal_bytes / peer.wal_bytes,
                        runrow.commits / max(peer.commits, 1),
                        runrow.buffers / max(peer.buffers, 1),
                        runrow.rate / bare.rate,
                        runrow.cpu / peer.cpu if runrow.cpu and peer.cpu else math.nan,
                    )
                )
    peer_label = f"{peer_name.split(' (')[0]} ({peer_name.split('(')[1].split(',')[0]})"
    lines = []
    for label, ratios in per_round.items():
        rate, wal, commits, buffers, to_bare, cpu_ratio = (
            statistics.median(x) for x in zip(*ratios, strict=True)
        )
        spent = "" if math.isnan(cpu_ratio) else f", {cpu_ratio:.2f}x CPU/job"
        spread = ""
        if len(ratios) > 1:
            rates = [x[0] for x in ratios]
            spread = f" (median of {len(ratios)} rounds, {min(rates):.2f}-{max(rates):.2f}x)"
        lines.append(
            f"    {label} / {peer_label}: {rate:.2f}x jobs/s{spread}, {wal:.2f}x WAL, "
            f"{commits:.2f}x commits, {buffers:.2f}x buffers{spent}; / bare SQL: {to_bare:.2f}x jobs/s"
        )
    return lines


def report(rows: list[Row], jobs: int) -> list[str]:
    rounds = max((r.round for r in rows), default=1)
    lines = [
        f"drain: {jobs:,} empty jobs, {PROCESSES} processes, fresh database per row"
        + (f", {rounds} rounds" if rounds > 1 else "")
    ]
    for batch in BATCHES:
        plain = [r for r in rows if r.batch == batch and "idle LISTEN" not in r.system]
        if not plain:
            continue
        lines.append(f"  batch {batch}")
        for row in plain:
            tag = f"  [round {row.round}]" if rounds > 1 else ""
            lines.append(f"    {row.system:<48}{row.cells()}{tag}")
        lines.extend(_ratio_lines(plain, batch))
    if jobs < JOBS and any(r.system.startswith("PgQueuer") for r in rows):
        # Measured: about 65-90 ms more per drain than the SQL API client, a quarter of
        # PgQueuer's drain of 2,000 jobs at batch 10 (bench/RESULTS.md, "Drain against PgQueuer").
        lines.append(
            f"  (fewer than {JOBS:,} jobs: PgQueuer's fixed start-up and drain-end time weigh on its"
            " rate, so these ratios flatter runrow; quote ratios from a full-size run)"
        )
    listening = [r for r in rows if "idle LISTEN" in r.system]
    if listening:
        lines.append(
            "  transactions per run beside idle LISTEN sessions (each wakes on every notifying commit)"
        )
        for row in listening:
            lines.append(f"    {row.system:<48}{row.cells()}")
    return lines


ROW_GROUPS = ("peers", "floor", "worker", "listen")


def run(
    short: bool = False, jobs: int | None = None, only: tuple[str, ...] = ROW_GROUPS, rounds: int = 1
) -> tuple[list[str], list[dict]]:
    jobs = jobs or (SHORT_JOBS if short else JOBS)
    rows: list[Row] = []
    drained = (PEER_SYSTEMS if "peers" in only else ()) + (FLOOR_SYSTEMS if "floor" in only else ())
    with bench_cluster() as (server, superuser):
        # Rounds alternate the systems (each round runs every row once, in the same order),
        # so a slow spell of the box lands on all of them rather than on one.
        for n in range(1, rounds + 1):
            for batch in BATCHES:
                for system in drained:
                    row = dataclasses.replace(drain_row(server, superuser, system, batch, jobs), round=n)
                    print(f"  batch {batch:>2}  {system:<48}{row.cells()}  [round {n}/{rounds}]", flush=True)
                    rows.append(row)
                if "worker" in only:
                    row = dataclasses.replace(worker_row(server, superuser, batch, jobs), round=n)
                    print(
                        f"  batch {batch:>2}  {row.system:<48}{row.cells()}  [round {n}/{rounds}]", flush=True
                    )
                    rows.append(row)
        if "listen" in only:
            for listeners in LISTENERS:
                for row in (
                    drain_row(server, superuser, RUNROW_API, BATCHES[-1], jobs, listeners),
                    worker_row(server, superuser, BATCHES[-1], jobs, listeners),
                ):
                    print(f"  {row.system:<53}{row.cells()}", flush=True)
                    rows.append(row)
        lines = [*report(rows, jobs), machine(server)]
        with psycopg.connect(server) as conn:
            settings = conn.execute(
                "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings WHERE name IN"
                " ('fsync', 'synchronous_commit', 'full_page_writes', 'shared_buffers', 'wal_level')"
            ).fetchone()[0]
        lines.append(f"settings: {settings}")
    return lines, [dataclasses.asdict(r) | {"jobs_per_second": r.rate} for r in rows]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = cli(
        "bench.drain",
        "Drain empty jobs through runrow (SQL API and worker), PgQueuer and a bare SQL queue, "
        "side by side on one fsync-on cluster; print jobs/s, WAL, commits, buffers and CPU (client + server) "
        "per job, and ratios; "
        "write the rows to $RUNROW_BENCH_JSON (default bench-drain.json).",
        f"{ON_A_CLUSTER} With --here it runs on DATABASE_URL's server instead.",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--short", action="store_true", help=f"{SHORT_JOBS:,} jobs per row instead of {JOBS:,}")
    size.add_argument(
        "--jobs", type=int, metavar="N", help="N jobs per row (the test suite drains a few hundred)"
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=ROW_GROUPS,
        help="run only these rows (repeatable): peers = bare SQL, PgQueuer and the SQL API; floor = "
        "runrow's writes without its rules, and its functions without its rule triggers "
        "(bench/floor.py); worker = runrow worker; listen = SQL API and worker beside 2 and 20 idle "
        "LISTEN sessions. Ratios need the peers.",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="run the peer, floor and worker rows N times, alternating systems, and quote each ratio as the "
        "median of the rounds with its range (one drain moves with the box's load; 3 is a fair minimum)",
    )
    parser.add_argument(
        "--here", action="store_true", help="run on DATABASE_URL's server instead of a private cluster"
    )
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if not 1 <= args.rounds <= 50:
        parser.error("--rounds must be between 1 and 50")
    return args


def main() -> None:
    args = parse_args(sys.argv[1:])
    lines, rows = run(args.short, args.jobs, tuple(args.only or ROW_GROUPS), args.rounds)
    print("\n".join(lines))
    out = os.environ.get("RUNROW_BENCH_JSON", "bench-drain.json")
    with open(out, "w") as f:
        json.dump({"report": lines, "rows": rows}, f, indent=2)
    print(f"(results in {out})")


if __name__ == "__main__":
    main()
