#!/usr/bin/env python3
"""A local Patroni cluster for failover tests: one etcd and two PostgreSQL 15 members.

Everything listens on loopback ports picked at start and lives under one folder that `stop`
removes. Replication is synchronous (`synchronous_mode: true`): a commit is acknowledged only
once the standby has flushed it, so a failover to that standby loses no acknowledged commit.
`primary_start_timeout: 0` makes Patroni fail over at once when the primary's postmaster
crashes instead of restarting it in place; `loop_wait: 1` makes the standby notice within about
a second. (A host that dies with its Patroni is taken over when the leader key expires: `ttl`,
20 s, Patroni's minimum.)

    python scripts/ha_cluster.py start [--dir DIR]   # prints the cluster as JSON, keeps running
    python scripts/ha_cluster.py status --dir DIR
    python scripts/ha_cluster.py stop --dir DIR

Needs `etcd` (Debian `etcd-server`) and Patroni (`pip install -e '.[ha]'`); `make test` and
`make failover` install both. As root, Patroni and PostgreSQL run as the `postgres` user
(PostgreSQL refuses root), etcd as the caller; where that user cannot read this environment's
packages, Patroni's are copied into the cluster's folder for it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PG_BIN = Path(os.environ.get("RUNROW_PG_BIN", "/usr/lib/postgresql/15/bin"))
SCOPE = "runrow-ha"
DB_NAME = "runrow"
OWNER = "runrow_admin"
SUPERUSER = "postgres"
STATE = "cluster.json"


class HAError(RuntimeError):
    """The HA stack could not be started, or did not reach the state asked for in time."""


@dataclass
class Member:
    name: str
    pg_port: int
    api_port: int
    datadir: str
    config: str
    log: str

    def api(self, path: str, timeout: float = 2.0) -> tuple[int, Any]:
        """GET Patroni's REST API: (status, JSON body); (0, None) when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}{path}", timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, None
        except (OSError, ValueError):
            return 0, None

    def postmaster_pid(self) -> int | None:
        try:
            return int(Path(self.datadir, "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None


@dataclass
class HACluster:
    root: str
    etcd_port: int
    members: list[Member]
    os_user: str | None
    pids: dict[str, int] = field(default_factory=dict)  # etcd and each member's patroni

    @property
    def hosts(self) -> str:
        return ",".join("127.0.0.1" for _ in self.members)

    @property
    def ports(self) -> str:
        return ",".join(str(m.pg_port) for m in self.members)

    def url(self, user: str = OWNER, db: str = DB_NAME) -> str:
        """A libpq multi-host URL that finds whichever member is the primary now."""
        return f"host={self.hosts} port={self.ports} dbname={db} user={user} target_session_attrs=read-write"

    def member_url(self, member: Member, user: str = OWNER, db: str = DB_NAME) -> str:
        return f"host=127.0.0.1 port={member.pg_port} dbname={db} user={user}"

    def topology(self) -> dict[str, str]:
        """member name -> role (leader, sync_standby, replica) as Patroni reports it."""
        for member in self.members:
            code, body = member.api("/cluster")
            if code == 200 and body:
                return {m["name"]: f"{m['role']}/{m.get('state', '')}" for m in body.get("members", [])}
        return {}

    def leader(self) -> Member | None:
        for member in self.members:
            if member.api("/primary")[0] == 200:
                return member
        return None

    def wait_healthy(self, timeout: float = 90) -> Member:
        """Until one member leads and the other is its streaming synchronous standby."""
        deadline = time.monotonic() + timeout
        while True:
            roles = self.topology()
            leader = self.leader()
            if leader is not None and sorted(roles.values()) == ["leader/running", "sync_standby/streaming"]:
                return leader
            if time.monotonic() > deadline:
                raise HAError(f"cluster not healthy after {timeout}s: {roles}\n{self.logs()}")
            time.sleep(0.2)

    def wait_leader(self, other_than: Member | None = None, timeout: float = 60) -> Member:
        deadline = time.monotonic() + timeout
        while True:
            leader = self.leader()
            if leader is not None and (other_than is None or leader.name != other_than.name):
                return leader
            if time.monotonic() > deadline:
                raise HAError(f"no new leader after {timeout}s: {self.topology()}\n{self.logs()}")
            time.sleep(0.05)

    def logs(self, tail: int = 30) -> str:
        out = []
        for name in ("etcd", *(m.name for m in self.members)):
            path = Path(self.root, f"{name}.log")
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-tail:]
                out.append(f"--- {name} ---\n" + "\n".join(lines))
        return "\n".join(out)

    def save(self) -> None:
        Path(self.root, STATE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, root: str) -> HACluster:
        raw = json.loads(Path(root, STATE).read_text())
        raw["members"] = [Member(**m) for m in raw["members"]]
        return cls(**raw)


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _patroni_argv(os_user: str | None, root: str) -> list[str]:
    """How to start Patroni as `os_user`: this interpreter when that user may run it, else the
    system's Python of the same version with Patroni's packages on its path (a venv built from a
    Python under /root is not executable by `postgres`)."""
    if os_user is None:
        return [sys.executable, "-m", "patroni"]
    probe = subprocess.run(["runuser", "-u", os_user, "--", sys.executable, "-c", "0"], capture_output=True)
    if probe.returncode == 0:
        return ["runuser", "-u", os_user, "--", sys.executable, "-m", "patroni"]
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/bin:/usr/local/bin")
    if system is None:
        raise HAError(f"{os_user} cannot run {sys.executable} and there is no /usr/bin/{version}")
    site = sysconfig.get_paths()["purelib"]
    argv = ["runuser", "-u", os_user, "--", "env", f"PYTHONPATH={site}", system]
    if subprocess.run([*argv, "-c", "import patroni"], capture_output=True).returncode == 0:
        return [*argv, "-m", "patroni"]
    # The checkout is in a folder `os_user` may not enter (/root, a `mktemp -d` folder: a CI's
    # clone may be either), so this environment's packages cannot be read there. A copy of
    # Patroni's own (about 25 MB) goes where the cluster lives, which that user may read.
    copy = _copy_patroni(os.path.join(root, "patroni-site"))
    argv = ["runuser", "-u", os_user, "--", "env", f"PYTHONPATH={copy}", system]
    probe = subprocess.run([*argv, "-c", "import patroni"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise HAError(f"{os_user} cannot import Patroni from {copy}:\n{probe.stderr[-2000:]}")
    return [*argv, "-m", "patroni"]


def _copy_patroni(target: str) -> str:
    """Copy the installed distributions of runrow's `ha` extra (Patroni with the extras named
    there, and everything they require) into `target`, a site folder for another user; the extra
    in pyproject.toml is the one list of them. A file already there is left as it is."""
    from importlib import metadata

    from packaging.requirements import Requirement

    def required(dist: metadata.Distribution, extras: set[str]) -> list[Requirement]:
        out = []
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
                out.append(req)
        return out

    # The extra's own requirements: those its marker admits with `ha` and not without it.
    wanted = [
        r
        for r in required(metadata.distribution("runrow"), {"ha"})
        if r.marker is not None and not r.marker.evaluate({"extra": ""})
    ]
    done: set[str] = set()
    while wanted:
        req = wanted.pop()
        dist = metadata.distribution(req.name)
        key = f"{dist.metadata['Name'].lower()}{sorted(req.extras)}"
        if key in done:
            continue
        done.add(key)
        base = Path(str(dist.locate_file("")))
        for file in dist.files or []:
            if file.parts[0] == ".." or "__pycache__" in file.parts:
                continue  # scripts in the venv's bin/; bytecode is written again as needed
            dest = Path(target, file)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():
                shutil.copy2(base / file, dest)
        wanted.extend(required(dist, set(req.extras)))
    return target


def _member_config(root: str, member: Member, etcd_port: int, sockdir: str) -> dict[str, Any]:
    hba = [
        "local all all trust",
        "host all all 127.0.0.1/32 trust",
        "host replication all 127.0.0.1/32 trust",
    ]
    superuser = {"username": SUPERUSER, "password": "runrow-ha"}
    return {
        "scope": SCOPE,
        "namespace": "/runrow/",
        "name": member.name,
        "log": {"level": "INFO"},
        "restapi": {
            "listen": f"127.0.0.1:{member.api_port}",
            "connect_address": f"127.0.0.1:{member.api_port}",
        },
        "etcd3": {"hosts": [f"127.0.0.1:{etcd_port}"]},
        "bootstrap": {
            "dcs": {
                "ttl": 20,
                "loop_wait": 1,
                "retry_timeout": 5,
                "maximum_lag_on_failover": 1048576,
                "synchronous_mode": True,
                "primary_start_timeout": 0,
                "postgresql": {
                    "use_pg_rewind": True,
                    "use_slots": True,
                    "parameters": {
                        "max_connections": 200,
                        "max_locks_per_transaction": 256,
                        "wal_level": "replica",
                        "hot_standby": "on",
                        "wal_log_hints": "on",
                        "max_wal_senders": 10,
                        "max_replication_slots": 10,
                        "synchronous_commit": "on",
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{member.pg_port}",
            "connect_address": f"127.0.0.1:{member.pg_port}",
            "data_dir": member.datadir,
            "bin_dir": str(PG_BIN),
            "pgpass": os.path.join(root, f"{member.name}.pgpass"),
            "authentication": {"superuser": superuser, "replication": superuser, "rewind": superuser},
            "parameters": {"unix_socket_directories": sockdir, "shared_buffers": "64MB"},
            "pg_hba": hba,
        },
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
    }


def start(root: str | None = None, members: int = 2) -> HACluster:
    for tool, hint in (
        ("etcd", "apt-get install etcd-server"),
        (str(PG_BIN / "initdb"), "apt-get install postgresql-15"),
    ):
        if shutil.which(tool) is None and not Path(tool).exists():
            raise HAError(f"{tool} not found: {hint} (or `make failover`, which installs it)")
    os_user = "postgres" if os.geteuid() == 0 else None
    root = root or tempfile.mkdtemp(prefix="runrow-ha-")
    os.makedirs(root, exist_ok=True)
    os.chmod(root, 0o755)
    ports = _free_ports(2 + 2 * members)
    cluster = HACluster(
        root=root,
        etcd_port=ports[0],
        members=[
            Member(
                name=f"pg{i + 1}",
                pg_port=ports[2 + 2 * i],
                api_port=ports[3 + 2 * i],
                datadir=os.path.join(root, f"pg{i + 1}"),
                config=os.path.join(root, f"pg{i + 1}.yml"),
                log=os.path.join(root, f"pg{i + 1}.log"),
            )
            for i in range(members)
        ],
        os_user=os_user,
    )
    try:
        _start_etcd(cluster, ports[1])
        argv = _patroni_argv(os_user, root)
        for member in cluster.members:
            sockdir = os.path.join(root, f"{member.name}.sock")
            os.mkdir(sockdir)
            Path(member.config).write_text(
                json.dumps(_member_config(root, member, cluster.etcd_port, sockdir))
            )
            if os_user is not None:
                ent = pwd.getpwnam(os_user)
                for path in (sockdir, member.config):
                    os.chown(path, ent.pw_uid, ent.pw_gid)
                os.chown(root, ent.pw_uid, ent.pw_gid)
            with open(member.log, "ab") as log:
                # In the cluster's folder: Patroni's helper processes change to their parent's
                # directory, which `os_user` may not enter (a checkout in a `mktemp -d` folder).
                proc = subprocess.Popen(
                    [*argv, member.config],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=root,
                )
            cluster.pids[member.name] = proc.pid
            if member is cluster.members[0]:
                # The first member bootstraps (initdb) alone; the others then clone it.
                cluster.save()
                cluster.wait_leader(timeout=90)
        cluster.save()
        cluster.wait_healthy()
        _create_database(cluster)
    except BaseException:
        stop(cluster)
        raise
    cluster.save()
    return cluster


def _start_etcd(cluster: HACluster, peer_port: int) -> None:
    data = os.path.join(cluster.root, "etcd")
    client = f"http://127.0.0.1:{cluster.etcd_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    with open(os.path.join(cluster.root, "etcd.log"), "ab") as log:
        proc = subprocess.Popen(
            [
                *("etcd", "--name", "runrow-etcd", "--data-dir", data),
                *("--listen-client-urls", client, "--advertise-client-urls", client),
                *("--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer),
                *("--initial-cluster", f"runrow-etcd={peer}", "--log-level", "warn"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    cluster.pids["etcd"] = proc.pid
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{client}/health", timeout=1) as r:
                if json.loads(r.read()).get("health") == "true":
                    return
        except (OSError, ValueError):
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise HAError(f"etcd did not start\n{cluster.logs()}")
        time.sleep(0.1)


def _create_database(cluster: HACluster) -> None:
    import psycopg

    sys.path.insert(0, str(REPO))
    from pyworker.db.migrate import migrate

    with psycopg.connect(cluster.url(SUPERUSER, "postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {OWNER} LOGIN CREATEROLE CREATEDB")
        conn.execute(f"CREATE DATABASE {DB_NAME} OWNER {OWNER}")
    leader = cluster.leader()
    assert leader is not None
    # yoyo takes a URL of one host; the leader's own is as good as the multi-host one here.
    migrate(f"postgresql://{OWNER}@127.0.0.1:{leader.pg_port}/{DB_NAME}")


def stop(cluster: HACluster) -> None:
    """Stop every process the cluster started (by pid) and remove its folder."""
    members = [cluster.pids[m.name] for m in cluster.members if m.name in cluster.pids]
    for pid in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)  # Patroni stops its PostgreSQL on the way out
    _wait_gone(members, 30)
    for member in cluster.members:  # a postmaster left behind by a killed Patroni
        pid = member.postmaster_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if "etcd" in cluster.pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(cluster.pids["etcd"], signal.SIGTERM)
        _wait_gone([cluster.pids["etcd"]], 10)
    shutil.rmtree(cluster.root, ignore_errors=True)


def _wait_gone(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for pid in pids:
        while True:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    break
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["start", "status", "stop"])
    parser.add_argument("--dir", help="the cluster's folder (start: default a new temp folder)")
    args = parser.parse_args(argv)
    if args.action == "start":
        cluster = start(args.dir)
        print(json.dumps({"dir": cluster.root, "url": cluster.url(), "topology": cluster.topology()}))
        print(f"stop it with: {sys.argv[0]} stop --dir {cluster.root}", file=sys.stderr)
        return 0
    if not args.dir:
        parser.error(f"{args.action} needs --dir")
    cluster = HACluster.load(args.dir)
    if args.action == "status":
        print(json.dumps({"dir": cluster.root, "url": cluster.url(), "topology": cluster.topology()}))
    else:
        stop(cluster)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except HAError as exc:
        print(f"ha_cluster: {exc}", file=sys.stderr)
        sys.exit(1)
