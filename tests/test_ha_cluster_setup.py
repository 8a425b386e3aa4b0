"""scripts/ha_cluster.py's set-up, without starting a cluster: as root, Patroni runs as
`postgres`, which must be able to import it. A checkout in a folder only root may enter (/root, a
`mktemp -d` folder, where a CI may clone) gave every member "No module named patroni" and
`make failover` a bare "no new leader after 90s". The packages of the `ha` extra are now copied
where the cluster lives, and postgres imports Patroni from there."""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from worker_support import REPO


def test_a_checkout_postgres_cannot_read_gets_a_copy_of_patroni_it_can_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("Patroni runs as postgres only when the harness runs as root")
    if shutil.which(version, path="/usr/bin:/usr/local/bin") is None:
        pytest.skip(f"no system {version} to fall back on")
    if importlib.util.find_spec("patroni") is None:
        pytest.skip("Patroni is not installed (make test installs the `ha` extra)")
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no postgres user")
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import ha_cluster

    hidden = tmp_path / "checkout"
    (hidden / "site-packages").mkdir(parents=True)
    hidden.chmod(0o700)
    # An interpreter and packages postgres cannot reach, as in a root-only checkout.
    monkeypatch.setattr(sys, "executable", str(hidden / "python"))
    monkeypatch.setattr(ha_cluster.sysconfig, "get_paths", lambda: {"purelib": str(hidden / "site-packages")})
    root = tempfile.mkdtemp(prefix="runrow-ha-test-")
    try:
        os.chmod(root, 0o755)  # as ha_cluster.start makes the cluster's folder
        argv = ha_cluster._patroni_argv("postgres", root)
        assert any(a == f"PYTHONPATH={root}/patroni-site" for a in argv), argv
        assert argv[-2:] == ["-m", "patroni"]
        # What a member loads: the etcd3 DCS and psycopg (the extras the `ha` extra names).
        probe = [
            *argv[:-2],
            "-c",
            "import patroni.dcs.etcd3, patroni.postgresql, psycopg; print(psycopg.__file__)",
        ]
        done = subprocess.run(probe, capture_output=True, text=True, cwd=root, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"{root}/patroni-site/"), done.stdout
    finally:
        shutil.rmtree(root)
