"""Running a benchmark module the way a reader of the README does (`python -m bench.<name>`), on
a cluster of its own, and reading back the figures it writes with --json.

A cluster of its own because what a VACUUM or a prune can drop, and so what the calls a
benchmark counts read afterwards, depends on the oldest transaction open anywhere in the
cluster, and the other xdist worker's tests hold some (a CI run of bench.trim read 44 buffers per
finish, not 37)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pyworker.db import devdb

ROOT = Path(__file__).resolve().parent.parent


def run_bench(module: str, *args: str, out: Path) -> tuple[str, dict[str, Any]]:
    """(the printed report, the figures) of `python -m bench.<module> *args --json out`."""
    with devdb.throwaway() as cluster:
        done = subprocess.run(
            [sys.executable, "-m", f"bench.{module}", *args, "--json", str(out)],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": cluster.url},
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())
