"""A fleet upgraded one piece at a time (the rolling-deploy audit). The order that works is
migrate first, then workers and services, and each piece refuses the order that does not:

- a worker or `runrow serve` on a schema older than the newest migration it ships refuses to
  start, naming `runrow migrate` (a new worker ran, then failed or released runs mid-way on the
  first function it lacked: an empty model turn ended `dead` after three paid attempts);
- `runrow migrate` and sql/install.sql on a database a newer runrow migrated refuse before
  writing (they re-apply functions/, and put older functions back: an old migrate job exited
  0 "already current" and priced 1-hour cache writes at the old rate again);
- a migrate removes set_model_price's five- and six-argument forms whenever an older install put
  one back (beside the newer one every five-argument call was ambiguous, 42725, for good: the
  migration that dropped it was recorded as applied).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pyworker.db.devdb import temporary_database
from pyworker.db.migrate import MigrateError, migrate
from pyworker.db.paths import INSTALL_SQL, MIGRATIONS_DIR
from pyworker.db.schema import required_version, shipped_migrations

REPO = Path(__file__).resolve().parent.parent
FUNCTIONS_SQL = (
    "SELECT md5(string_agg(p.prosrc, '' ORDER BY p.oid)) FROM pg_proc AS p"
    " WHERE p.pronamespace = 'runrow'::regnamespace"
)


@pytest.fixture
def older_database(database_url: str, tmp_path: Path) -> Iterator[str]:
    """A database migrated to the migration before this checkout's newest."""
    older = tmp_path / "older"
    older.mkdir()
    for migration in shipped_migrations()[:-1]:
        (older / f"{migration}.sql").symlink_to(MIGRATIONS_DIR / f"{migration}.sql")
    with temporary_database(database_url, "runrow_older", migrated=False) as url:
        migrate(url, migrations_dir=older)
        yield url


@pytest.fixture
def newer_database(database_url: str, tmp_path: Path) -> Iterator[str]:
    """A database a newer runrow migrated: one migration this checkout does not ship."""
    newer = tmp_path / "newer"
    shutil.copytree(MIGRATIONS_DIR, newer)
    (newer / "9999_from_a_newer_runrow.sql").write_text("CREATE TABLE runrow.from_a_newer_runrow (x int);\n")
    with temporary_database(database_url, "runrow_newer") as url:
        migrate(url, migrations_dir=newer)
        yield url


def cli(url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RUNROW_LISTEN_URL"}
    env["DATABASE_URL"] = url
    command = [sys.executable, "-m", "pyworker", *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_worker_on_an_older_schema_refuses_to_start(older_database: str) -> None:
    worker = cli(older_database, "worker", "--handler", "pyworker.worker.echo:handle", "--poll", "0.5")
    assert worker.returncode == 2, worker.stdout + worker.stderr
    assert f"older than this worker needs ({required_version()})" in worker.stderr, worker.stderr
    assert "run `runrow migrate`" in worker.stderr and "Traceback" not in worker.stderr


def test_serve_on_an_older_schema_refuses_to_start(older_database: str) -> None:
    served = cli(older_database, "serve", "--insecure-dev", "--port", "0")
    assert served.returncode == 2, served.stdout + served.stderr
    assert f"older than this runrow serve needs ({required_version()})" in served.stderr, served.stderr
    assert "Traceback" not in served.stderr


def test_migrate_refuses_a_database_a_newer_runrow_migrated(newer_database: str) -> None:
    with psycopg.connect(newer_database) as conn:
        before = conn.execute(FUNCTIONS_SQL).fetchone()
    with pytest.raises(MigrateError, match=r"1 migration\(s\) this runrow does not ship") as refused:
        migrate(newer_database)
    assert "9999_from_a_newer_runrow" in str(refused.value)  # its schema_version()
    with psycopg.connect(newer_database) as conn:
        assert conn.execute(FUNCTIONS_SQL).fetchone() == before  # no function re-applied


def test_install_sql_refuses_a_database_a_newer_runrow_migrated(newer_database: str) -> None:
    with psycopg.connect(newer_database) as conn:
        before = conn.execute(FUNCTIONS_SQL).fetchone()
    psql = subprocess.run(
        ["psql", newer_database, "-v", "ON_ERROR_STOP=1", "-q", "-f", str(INSTALL_SQL)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert psql.returncode != 0
    refusal = "this database has migrations this install.sql does not ship (9999_from_a_newer_runrow)"
    assert refusal in psql.stderr, psql.stderr
    with psycopg.connect(newer_database) as conn:
        assert conn.execute(FUNCTIONS_SQL).fetchone() == before


@pytest.mark.parametrize(
    "older",
    [
        "cache_read_per_mtok numeric",  # before migration 0071
        # Before 0076: beside the eight-argument form, a five- or six-argument call was ambiguous.
        "cache_read_per_mtok numeric, cache_write_1h_per_mtok numeric DEFAULT NULL",
    ],
    ids=["five", "six"],
)
def test_a_migrate_removes_an_older_set_model_price_an_older_install_put_back(
    database_url: str, older: str
) -> None:
    with temporary_database(database_url, "runrow_stale_overload") as url:
        with psycopg.connect(url) as conn:
            # What an older functions/set_model_price.sql re-creates beside the new form.
            conn.execute(
                "CREATE FUNCTION runrow.set_model_price(model text, input_per_mtok numeric,"
                f" output_per_mtok numeric, cache_write_per_mtok numeric, {older})"
                " RETURNS void LANGUAGE sql AS ''"
            )
            conn.commit()
            with pytest.raises(psycopg.errors.AmbiguousFunction):
                conn.execute("SELECT runrow.set_model_price('m', 3, 15, 3.75, 0.3)")
        migrate(url)
        with psycopg.connect(url) as conn:
            conn.execute("SELECT runrow.set_model_price('m', 3, 15, 3.75, 0.3)")
            conn.execute("SELECT runrow.set_model_price('m', 3, 15, 3.75, 0.3, 6)")
            assert conn.execute(
                "SELECT count(*) FROM pg_proc WHERE proname = 'set_model_price'"
                " AND pronamespace = 'runrow'::regnamespace"
            ).fetchone() == (1,)
