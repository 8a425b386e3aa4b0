"""scripts/ha_cluster.py's set-up, without starting a cluster: as root, Patroni runs as
`postgres`, which must be able to import it from this environment. A checkout in a folder only
root may enter (/root, a `mktemp -d` folder) gave every member "No module named patroni" and
`make failover` a bare "no new leader after 90s"; it now stops at once and says what to do."""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from pathlib import Path

import pytest
from worker_support import REPO


def test_a_checkout_postgres_cannot_read_is_refused_with_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("Patroni runs as postgres only when the harness runs as root")
    if shutil.which(version, path="/usr/bin:/usr/local/bin") is None:
        pytest.skip(f"no system {version} to fall back on")
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
    refused = r"postgres cannot import Patroni from .*Clone the repository"
    with pytest.raises(ha_cluster.HAError, match=refused):
        ha_cluster._patroni_argv("postgres")
