"""A private, throwaway PostgreSQL cluster built from the system's PG 15 binaries.

Used by the test command, the demo and `runrow db`. The cluster gets its own data
folder and socket folder under a fresh temp dir and listens on a Unix socket only,
so any number of them can run side by side without port clashes. When the caller is
root, initdb and the server run as the `postgres` user because PostgreSQL refuses to
run as root.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote

PG_BIN = Path(os.environ.get("RUNROW_PG_BIN", "/usr/lib/postgresql/15/bin"))
# The database and its owner. The owner is deliberately *not* a superuser: installing
# runrow must work with CREATEROLE + a database of one's own, as on managed PostgreSQL.
DB_NAME = "runrow"
OWNER = "runrow_admin"
SUPERUSER = "postgres"
PORT = 5432


class DevDbError(RuntimeError):
    """The throwaway cluster could not be created, started or stopped."""


@dataclass
class Cluster:
    root: str
    datadir: str
    sockdir: str
    os_user: str | None  # the OS user the server runs as, when we switched to one

    @property
    def url(self) -> str:
        """Connection URL for the non-superuser owner of the runrow database."""
        return _url(OWNER, DB_NAME, self.sockdir)

    @property
    def superuser_url(self) -> str:
        return _url(SUPERUSER, DB_NAME, self.sockdir)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Cluster:
        return cls(**json.loads(text))


def _url(user: str, db: str, sockdir: str) -> str:
    return f"postgresql://{user}@/{db}?host={quote(sockdir, safe='')}&port={PORT}"


def _as_server_user(argv: list[str], os_user: str | None) -> list[str]:
    if os_user is None:
        return argv
    return ["runuser", "-u", os_user, "--", *argv]


def _run(argv: list[str], os_user: str | None, **kw: object) -> None:
    proc = subprocess.run(
        _as_server_user(argv, os_user),
        capture_output=True,
        text=True,
        **kw,  # type: ignore[call-overload]
    )
    if proc.returncode != 0:
        raise DevDbError(f"{' '.join(argv[:2])} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")


def check_binaries() -> None:
    if not (PG_BIN / "initdb").exists():
        raise DevDbError(
            f"PostgreSQL 15 server binaries not found in {PG_BIN}. Install them with "
            "`sudo apt-get install postgresql-15` (or `make bootstrap`), or set "
            "DATABASE_URL to use an existing server instead."
        )


def new_cluster_folder(prefix: str, os_user: str | None) -> Cluster:
    """A fresh temp folder for a cluster (data dir not yet made, socket dir made), owned by
    `os_user` when given (PostgreSQL refuses to run as root)."""
    root = tempfile.mkdtemp(prefix=prefix)
    os.chmod(root, 0o755)
    datadir = os.path.join(root, "data")
    sockdir = os.path.join(root, "sock")
    os.mkdir(sockdir)
    if os_user is not None:
        ent = pwd.getpwnam(os_user)
        os.chown(root, ent.pw_uid, ent.pw_gid)
        os.chown(sockdir, ent.pw_uid, ent.pw_gid)
    return Cluster(root=root, datadir=datadir, sockdir=sockdir, os_user=os_user)


def start(
    fsync: bool = False,
    listen_addresses: str = "",
    trusted_networks: tuple[str, ...] = (),
    full_page_writes: bool = False,
) -> Cluster:
    """initdb + start a cluster and create the runrow database owned by runrow_admin.

    full_page_writes is off unless asked for (a throwaway cluster's crash safety is not needed);
    a benchmark of WAL as a production server writes it turns it on.

    By default it listens on its Unix socket only. The network fault tests give it an address
    of their own test hosts (`listen_addresses`, e.g. the root end of a veth pair) and the
    networks whose clients it trusts as it trusts local ones (`trusted_networks`, CIDR)."""
    check_binaries()
    cluster = new_cluster_folder("runrow-pg-", "postgres" if os.geteuid() == 0 else None)
    root, datadir, sockdir, os_user = cluster.root, cluster.datadir, cluster.sockdir, cluster.os_user
    try:
        _run(
            [
                str(PG_BIN / "initdb"),
                "-D",
                datadir,
                "-U",
                SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ],
            os_user,
        )
        if trusted_networks:
            with open(os.path.join(datadir, "pg_hba.conf"), "a") as hba:
                hba.writelines(f"host all all {network} trust\n" for network in trusted_networks)
        opts = (
            f"-c listen_addresses='{listen_addresses}' -c unix_socket_directories={sockdir} -c port={PORT} "
            f"-c fsync={'on' if fsync else 'off'} -c synchronous_commit={'on' if fsync else 'off'} "
            f"-c full_page_writes={'on' if full_page_writes else 'off'} "
            "-c max_connections=200 -c shared_buffers=128MB "
            "-c log_min_messages=warning -c max_locks_per_transaction=256"
        )
        _run(
            [
                str(PG_BIN / "pg_ctl"),
                "-D",
                datadir,
                "-o",
                opts,
                "-l",
                os.path.join(root, "server.log"),
                "-w",
                "-t",
                "60",
                "start",
            ],
            os_user,
        )
        _bootstrap_database(cluster)
    except BaseException:
        stop(cluster)
        raise
    return cluster


def _bootstrap_database(cluster: Cluster) -> None:
    import psycopg

    with psycopg.connect(_url(SUPERUSER, "postgres", cluster.sockdir), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {OWNER} LOGIN CREATEROLE CREATEDB")
        conn.execute(f"CREATE DATABASE {DB_NAME} OWNER {OWNER}")
    # pgTAP is not a trusted extension, so the superuser installs it into its own schema;
    # everything runrow itself is installed later by the non-superuser owner.
    with psycopg.connect(cluster.superuser_url, autocommit=True) as conn:
        with contextlib.suppress(psycopg.errors.FeatureNotSupported, psycopg.errors.UndefinedFile):
            conn.execute("CREATE SCHEMA tap")
            conn.execute("CREATE EXTENSION pgtap SCHEMA tap")
        conn.execute("GRANT USAGE ON SCHEMA tap TO PUBLIC")


def stop(cluster: Cluster) -> None:
    """Stop the server (fast) and remove every file the cluster had."""
    if os.path.exists(os.path.join(cluster.datadir, "postmaster.pid")):
        with contextlib.suppress(DevDbError):
            _run(
                [str(PG_BIN / "pg_ctl"), "-D", cluster.datadir, "-m", "immediate", "-w", "stop"],
                cluster.os_user,
            )
    shutil.rmtree(cluster.root, ignore_errors=True)


def restart(cluster: Cluster, mode: str = "immediate", executable: str | None = None) -> None:
    """Restart the server with the options it was started with. `immediate` is a crash: every
    session dies mid-statement and the server recovers from its WAL (fault tests).
    `executable` runs another postgres binary or a wrapper of it (bench.instructions: valgrind)."""
    _run(
        [
            str(PG_BIN / "pg_ctl"),
            "-D",
            cluster.datadir,
            *(["-p", executable] if executable else []),
            "-m",
            mode,
            # The log file keeps pg_ctl from handing the new server our stdout to hold open.
            "-l",
            os.path.join(cluster.root, "server.log"),
            "-w",
            "-t",
            "60",
            "restart",
        ],
        cluster.os_user,
    )


def restart_after(cluster: Cluster, seconds: float, mode: str = "immediate") -> None:
    """Stop the server at once and start it again `seconds` later, returning when it accepts
    connections: an outage of a known length (a failover, a long restart) for the outage tests.
    The server is started through a wrapper that sleeps first, so the outage is timed by the
    restart itself, not by the caller's thread."""
    wrapper = Path(cluster.root) / "postgres-after-an-outage"
    wrapper.write_text(f'#!/bin/sh\nsleep {seconds:g}\nexec {PG_BIN / "postgres"} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    restart(cluster, mode, str(wrapper))


@contextlib.contextmanager
def throwaway(
    fsync: bool = False,
    listen_addresses: str = "",
    trusted_networks: tuple[str, ...] = (),
    full_page_writes: bool = False,
) -> Iterator[Cluster]:
    cluster = start(
        fsync=fsync,
        listen_addresses=listen_addresses,
        trusted_networks=trusted_networks,
        full_page_writes=full_page_writes,
    )
    release = reap_if_owner_dies(cluster)
    try:
        yield cluster
    finally:
        stop(cluster)
        release()


def reap_if_owner_dies(cluster: Cluster) -> Callable[[], None]:
    """Start `orphan_reaper` for a cluster this process owns: if the process dies before it
    stops the cluster (SIGKILL, or SIGTERM's default action), the reaper stops it and removes
    its folder. Returns the call that dismisses the reaper once the cluster is stopped."""
    return _orphan_reaper("cluster", cluster.to_json())


def reap_process_if_owner_dies(pid: int, folder: str) -> Callable[[], None]:
    """The same for a server process of ours that lives in `folder` (a throwaway pgbouncer):
    if this process dies first, the reaper stops `pid` and removes `folder`."""
    return _orphan_reaper("process", str(pid), folder)


def reap_folder_if_owner_dies(folder: str) -> Callable[[], None]:
    """The same for a temp folder of ours (the demo's worker logs and workspace): if this process
    dies first, the reaper removes `folder` once no process works in it any more."""
    return _orphan_reaper("folder", folder)


def _orphan_reaper(*args: str) -> Callable[[], None]:
    read_end, write_end = os.pipe()  # both close-on-exec: only this process holds write_end
    try:
        reaper = subprocess.Popen(
            [sys.executable, "-m", "pyworker.db.orphan_reaper", *args],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # out of reach of a signal to this process's group
            # `-m` finds this package, not another pyworker in the caller's working directory.
            cwd=Path(__file__).resolve().parents[2],
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)

    def release() -> None:
        # A byte before the end: the reaper then knows the owner let it go and does nothing. Told
        # by EOF alone, it acted after a normal exit too, on a path whose folder the owner had
        # removed and anyone could have made a link to something else since (the review).
        with contextlib.suppress(OSError):
            os.write(write_end, b"released")
        os.close(write_end)
        with contextlib.suppress(subprocess.TimeoutExpired):
            reaper.wait(timeout=30)

    return release


STATE_FILE = Path(".runrow/db.json")


def save_state(cluster: Cluster, path: Path = STATE_FILE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cluster.to_json())


def load_state(path: Path = STATE_FILE) -> Cluster | None:
    if not path.exists():
        return None
    try:
        return Cluster.from_json(path.read_text())
    except (OSError, ValueError, TypeError, KeyError) as exc:  # empty, cut short, a folder, edited
        raise DevDbError(
            f"{path} does not describe a throwaway cluster ({type(exc).__name__}: {exc}); remove it "
            "(its cluster, if any, is a folder under the temp directory) and run `runrow db start`"
        ) from None


def wait_ready(cluster: Cluster, timeout: float = 10.0) -> None:
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        try:
            psycopg.connect(cluster.url).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def database_url_for(url: str, name: str) -> str:
    """The same server and credentials as `url`, another database."""
    from urllib.parse import urlsplit, urlunsplit

    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def drop_database(admin_url: str, name: str, timeout: float = 30.0) -> None:
    """Drop a database we created, without superuser rights.

    `DROP DATABASE ... WITH (FORCE)` would also have to terminate autovacuum workers, which
    only a superuser (or pg_signal_backend) may do; plain DROP DATABASE makes autovacuum
    step aside by itself. So: end our own sessions in it, then drop, retrying while a
    session of ours is still on its way out.
    """
    import psycopg
    from psycopg import sql

    deadline = time.monotonic() + timeout
    with psycopg.connect(admin_url, autocommit=True) as conn:
        while True:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid() AND usename = current_user",
                (name,),
            )
            try:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
                return
            except psycopg.errors.ObjectInUse:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@contextlib.contextmanager
def temporary_database(admin_url: str, prefix: str, *, migrated: bool = True) -> Iterator[str]:
    """A fresh database on the server of `admin_url` (whose role needs CREATEDB), migrated
    unless told otherwise (a copy of migrated_template()), dropped afterwards. Tests and
    benchmarks that must see only their own runs use one each."""
    import uuid

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    template = migrated_template(admin_url) if migrated else None
    _create_database(admin_url, name, template)
    url = database_url_for(admin_url, name)
    try:
        yield url
    finally:
        drop_database(admin_url, name)


TEMPLATE_PREFIX = "runrow_template_"


def migrated_template(admin_url: str, timeout: float = 300.0) -> str:
    """A database on the server of `admin_url` migrated to this checkout's schema, made once and
    then copied: CREATE DATABASE ... TEMPLATE takes about 0.06 s where a migrate takes about
    1.7 s, and the test suite makes a migrated database for some 200 tests. Its name holds a
    hash of migrations/ and functions/, so an edited schema gets a template of its own. It is
    built under another name, whose CREATE DATABASE is the lock among builders (an advisory
    lock is per database, and the two test processes connect to databases of their own), and
    renamed when whole; closed to connections, so nothing (not autovacuum either) changes it
    between copies."""
    import psycopg
    from psycopg import sql

    name = TEMPLATE_PREFIX + _schema_digest()
    building = f"{name}_building"
    deadline = time.monotonic() + timeout
    with psycopg.connect(admin_url, autocommit=True) as conn:
        while not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(building)))
            except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                # Another process builds it: wait for the rename (or, past the deadline, take
                # it for the leftover of a build that was killed).
                if time.monotonic() > deadline:
                    drop_database(admin_url, building)
                    deadline = time.monotonic() + timeout
                time.sleep(0.2)
                continue
            try:
                # Another builder may have renamed its copy between our look and our CREATE.
                if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                    drop_database(admin_url, building)
                    return name
                from pyworker.db.migrate import migrate

                migrate(database_url_for(admin_url, building))
                built, final = sql.Identifier(building), sql.Identifier(name)
                conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(built))
                conn.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(built, final))
            except psycopg.errors.DuplicateDatabase:
                drop_database(admin_url, building)  # the other builder's rename came first
                return name
            except BaseException:
                drop_database(admin_url, building)
                raise
    return name


@functools.cache
def _schema_digest() -> str:
    """A hash of migrations/ and functions/, read once per process (a template is asked for by
    every test that takes a migrated database)."""
    import hashlib

    from pyworker.db.paths import FUNCTIONS_DIR, MIGRATIONS_DIR

    digest = hashlib.sha256()
    for path in sorted([*MIGRATIONS_DIR.glob("*.sql"), *FUNCTIONS_DIR.glob("*.sql")]):
        digest.update(f"{path.parent.name}/{path.name}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def drop_templates(admin_url: str) -> None:
    """Drop every migrated_template() database on the server of `admin_url`."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        names = [
            n
            for (n,) in conn.execute(
                # Whole templates only: a copy being built is another run's (a shared server).
                "SELECT datname FROM pg_database WHERE datname LIKE %s AND datname NOT LIKE %s",
                (TEMPLATE_PREFIX + "%", "%\\_building"),
            ).fetchall()
        ]
    for name in names:
        drop_database(admin_url, name)


def _create_database(admin_url: str, name: str, template: str | None) -> None:
    import psycopg
    from psycopg import sql

    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for attempt in range(50):
            try:
                conn.execute(statement)
                return
            except psycopg.errors.ObjectInUse:
                # Another copy of the template starts at this moment (each holds it briefly).
                if attempt == 49:
                    raise
                time.sleep(0.1)
