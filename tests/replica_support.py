"""A throwaway primary and a real streaming hot standby of it, for tests that read a replica.

The primary is `pyworker.db.devdb`'s private cluster; the standby is `pg_basebackup -R` of it
(streaming over the primary's Unix socket as its superuser), started with a socket folder of
its own. Replay can be paused and resumed, so a test decides exactly how far behind it is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg

from pyworker.db import devdb
from pyworker.db.migrate import migrate


@dataclass
class Replicated:
    primary: devdb.Cluster
    standby: devdb.Cluster

    def wait_replayed(self, timeout: float = 30) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        with psycopg.connect(self.primary.superuser_url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
        assert row is not None
        with psycopg.connect(self.standby.superuser_url, autocommit=True) as conn:
            _poll(
                conn,
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                (row[0],),
                timeout,
                f"the standby to replay up to {row[0]}",
            )

    def pause_replay(self, timeout: float = 30) -> None:
        with psycopg.connect(self.standby.superuser_url, autocommit=True) as conn:
            conn.execute("SELECT pg_wal_replay_pause()")
            _poll(conn, "SELECT pg_get_wal_replay_pause_state() = 'paused'", (), timeout, "replay to pause")

    def stop_standby(self) -> None:
        """The standby's server dies (immediate shutdown); its files stay until the pair is removed."""
        pg_ctl = str(devdb.PG_BIN / "pg_ctl")
        devdb._run(
            [pg_ctl, "-D", self.standby.datadir, "-m", "immediate", "-w", "stop"], self.standby.os_user
        )

    def restart_standby(self) -> None:
        if not os.path.exists(os.path.join(self.standby.datadir, "postmaster.pid")):
            _start_server(self.standby)

    def resume_replay(self) -> None:
        with psycopg.connect(self.standby.superuser_url, autocommit=True) as conn:
            conn.execute("SELECT pg_wal_replay_resume()")


def _poll(
    conn: psycopg.Connection, query: str, params: tuple[object, ...], timeout: float, what: str
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute(query, params).fetchone()
        if row is not None and row[0]:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def start_standby(primary: devdb.Cluster) -> devdb.Cluster:
    """pg_basebackup -R of `primary` into a new folder, started as a hot standby."""
    standby = devdb.new_cluster_folder("runrow-standby-", primary.os_user)
    try:
        source = f"host={primary.sockdir} port={devdb.PORT} user={devdb.SUPERUSER}"
        pg = devdb.PG_BIN
        devdb._run(
            [
                str(pg / "pg_basebackup"),
                "-D",
                standby.datadir,
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "-d",
                source,
            ],
            standby.os_user,
        )
        _start_server(standby)
    except BaseException:
        devdb.stop(standby)
        raise
    return standby


def _start_server(standby: devdb.Cluster) -> None:
    # A hot standby refuses to start with max_connections or max_locks_per_transaction below
    # the primary's; devdb passes its settings on the command line, so they are not copied.
    opts = (
        f"-c listen_addresses='' -c unix_socket_directories={standby.sockdir} -c port={devdb.PORT} "
        "-c fsync=off -c max_connections=200 -c shared_buffers=64MB -c hot_standby=on "
        "-c log_min_messages=warning -c max_locks_per_transaction=256"
    )
    log = os.path.join(standby.root, "server.log")
    pg_ctl = str(devdb.PG_BIN / "pg_ctl")
    devdb._run(
        [pg_ctl, "-D", standby.datadir, "-o", opts, "-l", log, "-w", "-t", "60", "start"], standby.os_user
    )


@contextlib.contextmanager
def replicated_cluster() -> Iterator[Replicated]:
    """A migrated throwaway primary and its streaming standby, both removed afterwards."""
    primary = devdb.start()
    releases = [devdb.reap_if_owner_dies(primary)]
    standby: devdb.Cluster | None = None
    try:
        migrate(primary.url)
        standby = start_standby(primary)
        releases.append(devdb.reap_if_owner_dies(standby))
        pair = Replicated(primary, standby)
        pair.wait_replayed()
        yield pair
    finally:
        if standby is not None:
            devdb.stop(standby)
        devdb.stop(primary)
        shutil.rmtree(primary.root, ignore_errors=True)
        for release in releases:
            release()
