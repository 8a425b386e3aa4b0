"""A private pgbouncer in transaction mode in front of a throwaway cluster.

The tests use it to prove runrow works through a real transaction pooler (Debian's `pgbouncer`,
installed by `make bootstrap`). Like the throwaway cluster it lives in a temp dir of its own:
a Unix socket there, and a TCP address only when asked for one (the network-namespace tests give
it the root end of a veth pair). Authentication is `trust`, as the cluster behind it allows.
When the caller is root it runs as `postgres`, since pgbouncer refuses to run as root.
Every database of the cluster is served under its own name (a `*` entry).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from psycopg.conninfo import conninfo_to_dict

from pyworker.db import devdb
from pyworker.db.devdb import OWNER, SUPERUSER, DevDbError

PGBOUNCER = Path(os.environ.get("RUNROW_PGBOUNCER", "/usr/sbin/pgbouncer"))
PORT = 6432


@dataclass
class Bouncer:
    root: str
    sockdir: str
    port: int
    listen_addr: str | None
    proc: subprocess.Popen[bytes] = field(repr=False)

    @property
    def log_path(self) -> str:
        return os.path.join(self.root, "pgbouncer.log")

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace") if os.path.exists(self.log_path) else ""

    def url_for(self, database_url: str, *, tcp: bool = False) -> str:
        """`database_url` (same user and database) through this pooler: its Unix socket, or its
        TCP address when `tcp`."""
        parts = urlsplit(database_url)
        user = parts.username or OWNER
        db = parts.path.lstrip("/")
        if tcp:
            if self.listen_addr is None:
                raise DevDbError("this pgbouncer listens on a Unix socket only")
            return f"postgresql://{user}@{self.listen_addr}:{self.port}/{db}"
        query = f"host={quote(self.sockdir, safe='')}&port={self.port}"
        return urlunsplit(("postgresql", f"{user}@", f"/{db}", query, ""))


def check_binary() -> None:
    if not PGBOUNCER.exists():
        raise DevDbError(
            f"pgbouncer not found at {PGBOUNCER}: `sudo apt-get install pgbouncer` (or `make bootstrap`)"
        )


def start(
    server_url: str,
    *,
    pool_size: int = 4,
    listen_addr: str | None = None,
    port: int = PORT,
    settings: dict[str, str] | None = None,
    raw_settings: str = "",
    timeout: float = 15.0,
) -> Bouncer:
    """Start pgbouncer (pool_mode = transaction) in front of the server of `server_url` (a
    throwaway cluster's URL); `settings` are extra or overriding [pgbouncer] lines, e.g.
    {"ignore_startup_parameters": "options"}; `raw_settings`, ini text appended to the
    [pgbouncer] section as it is (a later line wins)."""
    check_binary()
    target = conninfo_to_dict(server_url)
    os_user = "postgres" if os.geteuid() == 0 else None
    root = tempfile.mkdtemp(prefix="runrow-pgbouncer-")
    os.chmod(root, 0o755)
    sockdir = os.path.join(root, "sock")
    os.mkdir(sockdir)
    config = {
        "listen_addr": listen_addr or "",
        "listen_port": str(port),
        "unix_socket_dir": sockdir,
        "auth_type": "trust",
        "auth_file": os.path.join(root, "userlist.txt"),
        "pool_mode": "transaction",
        "default_pool_size": str(pool_size),
        "max_client_conn": "500",
        "logfile": os.path.join(root, "pgbouncer.log"),
        "pidfile": os.path.join(root, "pgbouncer.pid"),
        "admin_users": SUPERUSER,
        "ignore_startup_parameters": "extra_float_digits",
        **(settings or {}),
    }
    ini = "[databases]\n* = host={} port={}\n\n[pgbouncer]\n{}\n{}".format(
        target.get("host") or "/var/run/postgresql",
        target.get("port") or 5432,
        "\n".join(f"{k} = {v}" for k, v in config.items()),
        raw_settings,
    )
    Path(root, "pgbouncer.ini").write_text(ini)
    Path(root, "userlist.txt").write_text(f'"{OWNER}" ""\n"{SUPERUSER}" ""\n')
    argv = [str(PGBOUNCER), os.path.join(root, "pgbouncer.ini")]
    if os_user is not None:
        ent = pwd.getpwnam(os_user)
        for path in (root, sockdir, *(os.path.join(root, n) for n in ("pgbouncer.ini", "userlist.txt"))):
            os.chown(path, ent.pw_uid, ent.pw_gid)
        argv = ["runuser", "-u", os_user, "--", *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    bouncer = Bouncer(root=root, sockdir=sockdir, port=port, listen_addr=listen_addr, proc=proc)
    socket_file = os.path.join(sockdir, f".s.PGSQL.{port}")
    deadline = time.monotonic() + timeout
    while not os.path.exists(socket_file):
        if proc.poll() is not None or time.monotonic() > deadline:
            exited = proc.stderr is not None and proc.poll() is not None
            err = proc.stderr.read().decode(errors="replace") if exited and proc.stderr else ""
            stop(bouncer)
            raise DevDbError(f"pgbouncer did not start:\n{err}{bouncer.log()}")
        time.sleep(0.05)
    return bouncer


def stop(bouncer: Bouncer) -> None:
    """Stop pgbouncer and remove its files."""
    if bouncer.proc.poll() is None:
        # runuser passes SIGTERM on to pgbouncer, which then closes every connection at once.
        bouncer.proc.send_signal(signal.SIGTERM)
        try:
            bouncer.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            bouncer.proc.kill()
            bouncer.proc.wait(timeout=10)
    if bouncer.proc.stderr is not None:
        bouncer.proc.stderr.close()
    shutil.rmtree(bouncer.root, ignore_errors=True)


@contextlib.contextmanager
def running(server_url: str, **kwargs: object) -> Iterator[Bouncer]:
    bouncer = start(server_url, **kwargs)  # type: ignore[arg-type]
    release = devdb.reap_process_if_owner_dies(bouncer.proc.pid, bouncer.root)
    try:
        yield bouncer
    finally:
        stop(bouncer)
        release()
