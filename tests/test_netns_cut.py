"""A worker host cut off from the network while it holds a run, proven with a real cut.

The worker runs in a network namespace of its own, joined to the root namespace by a veth pair
with link-local addresses of the project's own test hosts (169.254.77.1/30 here, .2/30 there;
no traffic goes anywhere else). A private throwaway cluster listens on the root end. The worker
is frozen inside a journal flush (RUNROW_TEST_FLUSH_PAUSE holds the transaction, and with it the
run's row lock) when the test takes the link down. Then, from the server's side alone:

- the frozen session is ended by the worker's own idle_in_transaction_session_timeout (its
  lease), and its locks go with it; every other session of the cut-off host is ended by the
  server's keepalives / tcp_user_timeout (also derived from the lease) within about a lease;
- another worker's reaper takes the run within about lease + grace of the session ending, and
  that worker runs it to the end;
- when the link comes back, the cut-off worker learns it lost the run and writes nothing into it.

Needs root and `ip` (iproute2); skipped with a clear message otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from worker_support import WorkerProcess, enqueue_echo, events, run_row, status, wait_until

from pyworker.db import devdb, pgbouncer
from pyworker.db.migrate import migrate

HOST_ADDR = "169.254.77.1"  # the root namespace's end: PostgreSQL listens here
CUT_ADDR = "169.254.77.2"  # the cut-off worker's host
NETWORK = "169.254.77.0/30"
LEASE = 3
GRACE = 1


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@dataclass
class Link:
    namespace: str
    host_dev: str  # in the root namespace
    cut_dev: str  # in the worker's namespace

    def down(self) -> None:
        _ip("link", "set", self.host_dev, "down")

    def up(self) -> None:
        _ip("link", "set", self.host_dev, "up")


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "network namespaces need `ip` (Debian iproute2)"
    return None


@pytest.fixture(scope="module")
def link() -> Iterator[Link]:
    reason = _unavailable()
    if reason:
        pytest.skip(f"worker host partition test skipped: {reason}")
    tag = f"{os.getpid() % 100000}"
    link = Link(namespace=f"runrow-cut-{tag}", host_dev=f"rrcut{tag}h", cut_dev=f"rrcut{tag}w")
    try:
        made = _ip("netns", "add", link.namespace, check=False)
        if made.returncode != 0:
            pytest.skip(
                f"worker host partition test skipped: cannot create a network namespace: {made.stderr}"
            )
        _ip("link", "add", link.host_dev, "type", "veth", "peer", "name", link.cut_dev)
        _ip("link", "set", link.cut_dev, "netns", link.namespace)
        _ip("addr", "add", f"{HOST_ADDR}/30", "dev", link.host_dev)
        _ip("link", "set", link.host_dev, "up")
        inside = ("-n", link.namespace)
        _ip(*inside, "addr", "add", f"{CUT_ADDR}/30", "dev", link.cut_dev)
        _ip(*inside, "link", "set", link.cut_dev, "up")
        _ip(*inside, "link", "set", "lo", "up")
        yield link
    finally:
        # Deleting the namespace deletes its end of the pair, and with it the other end.
        _ip("netns", "del", link.namespace, check=False)
        _ip("link", "del", link.host_dev, check=False)


@pytest.fixture(scope="module")
def cluster(link: Link) -> Iterator[devdb.Cluster]:
    """A private cluster on its Unix socket and on the root end of the veth pair."""
    with devdb.throwaway(listen_addresses=HOST_ADDR, trusted_networks=(NETWORK,)) as c:
        migrate(c.url)
        yield c


@pytest.fixture
def db(cluster: devdb.Cluster) -> Iterator[psycopg.Connection]:
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        w.close()


def sessions_from(db: psycopg.Connection, addr: str) -> list[tuple[int, str]]:
    rows = db.execute(
        "SELECT pid, state FROM pg_stat_activity"
        " WHERE client_addr = %s::inet AND datname = current_database()",
        (addr,),
    ).fetchall()
    return [(pid, state) for pid, state in rows]


def locks_of(db: psycopg.Connection, pid: int) -> int:
    return db.execute("SELECT count(*) FROM pg_locks WHERE pid = %s", (pid,)).fetchone()[0]  # type: ignore[index]


# What the README recommends behind pgbouncer, which refuses (or drops) the worker's `options`:
# the pooler ends a client idle in a transaction, and notices a vanished one, within a lease.
BOUNCER_LIMITS = {
    "idle_transaction_timeout": str(LEASE),
    "tcp_keepalive": "1",
    "tcp_keepidle": "1",
    "tcp_keepintvl": "1",
    "tcp_keepcnt": "4",
    "tcp_user_timeout": str(LEASE * 1000),
}


@pytest.fixture(params=["direct", "pgbouncer"])
def remote(request: pytest.FixtureRequest, cluster: devdb.Cluster) -> Iterator[str]:
    """The URL the cut-off host uses: the server's address on the veth, or a pgbouncer there."""
    if request.param == "direct":
        yield f"postgresql://{devdb.OWNER}@{HOST_ADDR}:{devdb.PORT}/{devdb.DB_NAME}"
        return
    try:
        pgbouncer.check_binary()
    except devdb.DevDbError as exc:
        pytest.skip(str(exc))
    with pgbouncer.running(cluster.url, listen_addr=HOST_ADDR, settings=BOUNCER_LIMITS) as bouncer:
        yield bouncer.url_for(cluster.url, tcp=True)


def frozen_flushes(db: psycopg.Connection) -> list[int]:
    rows = db.execute(
        "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND state = 'idle in transaction'"
    ).fetchall()
    return [pid for (pid,) in rows]


def test_a_cut_off_worker_loses_its_session_locks_and_runs_and_writes_nothing_after(
    link: Link, cluster: devdb.Cluster, db: psycopg.Connection, workers: list[WorkerProcess], remote: str
) -> None:
    pooled = f":{pgbouncer.PORT}/" in remote
    cut = WorkerProcess(
        remote,
        "cut-off",
        ["--lease", str(LEASE), "--concurrency", "1", "--reap-interval", "600", "--poll", "0.5"],
        env={"RUNROW_TEST_FLUSH_PAUSE": "20"},
        prefix=["ip", "netns", "exec", link.namespace],
    )
    workers.append(cut)
    cut.wait_started()
    run = enqueue_echo(db, "finished by the other host", duration=1, max_attempts=2)
    cut.wait_log("test hook: flush transaction paused")
    frozen = frozen_flushes(db)
    assert len(frozen) == 1, frozen
    assert locks_of(db, frozen[0]) > 0
    assert run_row(db, run)["worker_id"] == "cut-off"
    # Another host, up all along: its reaper skips the locked row until the lock is gone.
    other = WorkerProcess(
        cluster.url, "other-host", ["--lease", str(LEASE), "--grace", str(GRACE), "--reap-interval", "0.3"]
    )
    workers.append(other)
    other.wait_started()

    link.down()
    cut_at = time.monotonic()

    # The server ends the frozen session by itself: idle_in_transaction_session_timeout = lease
    # (through pgbouncer, which drops the worker's options: its idle_transaction_timeout closes
    # the client, and with it the server session in the middle of its transaction).
    wait_until(lambda: locks_of(db, frozen[0]) == 0, LEASE + 10, "the frozen session's locks to be released")
    ended_after = time.monotonic() - cut_at
    assert frozen[0] not in frozen_flushes(db)
    if not pooled:
        # ...and every other session of that host (pool, hub's LISTEN) through keepalives and
        # tcp_user_timeout: nothing of a vanished host lingers for the kernel's two hours.
        wait_until(
            lambda: not sessions_from(db, CUT_ADDR), 4 * LEASE + 10, "every session of the host to end"
        )

    # Reaped once its lease (extended at most by a heartbeat that was waiting on the lock) and
    # the grace have run out after the session ended, and run to the end there.
    wait_until(
        lambda: status(db, run) == "completed", 2 * LEASE + GRACE + 15, "the other host to finish the run"
    )
    finished_after = time.monotonic() - cut_at
    row = run_row(db, run)
    assert (row["worker_id"], row["attempt"]) == ("other-host", 2)
    journal = events(db, run)
    kinds = [e["type"] for e in journal]
    assert kinds.count("run_requeued") == 1 and kinds.count("complete") == 1 and kinds[-1] == "complete"
    # Nothing of the frozen batch landed: the first attempt journaled only its claim.
    assert kinds[:5] == ["user_message_created", "run_queued", "run_claimed", "run_requeued", "run_claimed"]
    print(
        f"cut -> frozen session ended: {ended_after:.1f}s; cut -> completed elsewhere: {finished_after:.1f}s"
    )

    # The link returns: the cut-off worker finds out it lost the run and writes nothing into it.
    link.up()
    wait_until(
        lambda: any(note in cut.log() for note in ("fenced out", "run lost", "no longer ours")),
        60,
        f"the cut-off worker to learn it lost the run\n{cut.log()}",
    )
    assert events(db, run) == journal
    assert status(db, run) == "completed"
    cut.signal(signal.SIGTERM)
    assert cut.wait_exit(30) == 0
    assert events(db, run) == journal
    assert db.execute("SELECT * FROM runrow.audit()").fetchall() == []
