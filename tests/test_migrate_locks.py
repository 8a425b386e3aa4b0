"""`runrow migrate` against a live database (the DBA audit), on private clusters:

- a migration whose ALTER TABLE waits behind a long transaction (a report, a pg_dump) gives up
  its lock request after LOCK_TIMEOUT and is tried again, so the claims queued behind that
  request wait seconds, not as long as the report runs (they were cancelled by their
  statement_timeout while a migrate waited 19 s behind a 20 s report);
- a stale row in yoyo's lock table (a migrate killed mid-way, or one a pg_dump caught and a
  restore brought back) is cleared instead of failing every later migrate with a traceback.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import psycopg
import pytest

from pyworker.db import devdb
from pyworker.db.migrate import LOCK_ATTEMPTS, MigrateError, migrate
from pyworker.db.paths import MIGRATIONS_DIR


@pytest.fixture
def cluster() -> devdb.Cluster:
    with devdb.throwaway() as c:
        migrate(c.url)
        yield c


def test_a_migration_behind_a_long_transaction_does_not_stall_the_claims(
    cluster: devdb.Cluster, tmp_path: Path
) -> None:
    migrations = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, migrations)
    (migrations / "9999_behind_a_report.sql").write_text(
        "ALTER TABLE runrow.agent_run ADD CONSTRAINT behind_a_report CHECK (true) NOT VALID;\n"
    )
    report = psycopg.connect(cluster.superuser_url)
    report.execute("SELECT count(*) FROM runrow.agent_run")  # an open transaction: ACCESS SHARE
    errors: list[BaseException] = []

    def run() -> None:
        try:
            migrate(cluster.url, migrations_dir=migrations)
        except BaseException as error:  # handed to the main thread, asserted below
            errors.append(error)

    migrating = threading.Thread(target=run)
    try:
        with psycopg.connect(cluster.superuser_url, autocommit=True) as observer:
            migrating.start()
            for _ in range(200):
                (waiting,) = observer.execute(
                    "SELECT count(*) FROM pg_locks "
                    "WHERE NOT granted AND relation = 'runrow.agent_run'::regclass"
                ).fetchone()
                if waiting:
                    break
                migrating.join(0.05)
            assert waiting, "the migration never queued for its lock"
            # A claim queued behind the migration's request: it waits for that request to give
            # up, not for the report to end (it never does here).
            with psycopg.connect(cluster.url, autocommit=True) as worker:
                worker.execute("SET statement_timeout = '8s'")
                worker.execute("SELECT * FROM runrow.claim_runs('w', 1, 30)").fetchall()
            migrating.join(60)
            assert not migrating.is_alive()
    finally:
        report.close()
        migrating.join(60)
    assert len(errors) == 1 and isinstance(errors[0], MigrateError), errors
    assert f"for a lock {LOCK_ATTEMPTS} times and was rolled back" in str(errors[0])
    with psycopg.connect(cluster.superuser_url) as check:
        assert check.execute(
            "SELECT count(*) FROM pg_constraint WHERE conname = 'behind_a_report'"
        ).fetchone() == (0,)
    # Once the report has ended, the same migrate goes through.
    assert migrate(cluster.url, migrations_dir=migrations).applied == ["9999_behind_a_report"]


def test_a_stale_yoyo_lock_row_does_not_stop_a_migrate(cluster: devdb.Cluster) -> None:
    with psycopg.connect(cluster.superuser_url, autocommit=True) as db:
        db.execute("INSERT INTO runrow.yoyo_lock (locked, ctime, pid) VALUES (1, now(), 4242)")
    migrate(cluster.url)  # yoyo waited 10 s on the row, then raised LockTimeout
    with psycopg.connect(cluster.superuser_url, autocommit=True) as db:
        assert db.execute("SELECT count(*) FROM runrow.yoyo_lock").fetchone() == (0,)
