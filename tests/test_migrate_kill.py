"""`runrow migrate` killed (SIGKILL, a real process) at the moment a migration has run and its
record has not been written: the migration and its record commit together or not at all, so the
next migrate applies it, once. yoyo commits the migration on a connection of its own and records
it in a second transaction; killed between the two, the migration stayed applied and
unrecorded, and every later migrate failed on the objects it had already made (the DBA audit's
suspicion, confirmed here)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psycopg

from pyworker.db import devdb
from pyworker.db.migrate import migrate
from pyworker.db.paths import MIGRATIONS_DIR

REPO = Path(__file__).resolve().parent.parent

# Runs migrate in a process of its own that kills itself with SIGKILL when yoyo goes to record
# 9999: what a crash, an OOM kill or a lost host does at that moment.
KILLED_WHILE_RECORDING = """
import os, signal, sys
from pathlib import Path
from yoyo.backends.base import DatabaseBackend
from pyworker.db.migrate import migrate

record = DatabaseBackend.mark_one

def mark_one(self, migration, log=True):
    if migration.id == "9999_killed_while_recorded":
        os.kill(os.getpid(), signal.SIGKILL)
    return record(self, migration, log)

DatabaseBackend.mark_one = mark_one
migrate(sys.argv[1], migrations_dir=Path(sys.argv[2]))
"""


def test_a_migrate_killed_before_the_record_is_written_leaves_nothing_applied(
    database_url: str, tmp_path: Path
) -> None:
    migrations = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, migrations)
    (migrations / "9999_killed_while_recorded.sql").write_text("CREATE TABLE runrow.made_once (x int);\n")
    with devdb.temporary_database(database_url, "runrow_migrate_kill") as url:
        killed = subprocess.run(
            [sys.executable, "-c", KILLED_WHILE_RECORDING, url, str(migrations)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        with psycopg.connect(url) as db:
            assert db.execute("SELECT to_regclass('runrow.made_once')").fetchone() == (None,)
        # The next migrate applies it, once, and records it.
        assert migrate(url, migrations_dir=migrations).applied == ["9999_killed_while_recorded"]
        assert migrate(url, migrations_dir=migrations).applied == []
