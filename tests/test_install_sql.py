"""sql/install.sql: generated, current, idempotent, interchangeable with `runrow migrate`."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from pyworker.db.devdb import database_url_for
from pyworker.db.installsql import render
from pyworker.db.migrate import MigrateError, function_files, migrate
from pyworker.db.paths import INSTALL_SQL, MIGRATIONS_DIR, ROOT


def _psql_install(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["psql", url, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(INSTALL_SQL)],
        capture_output=True,
        text=True,
        check=False,
    )


def _api(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')' "
            "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'runrow' ORDER BY 1"
        ).fetchall()
    return [r[0] for r in rows]


def test_install_sql_is_current() -> None:
    assert INSTALL_SQL.read_text() == render(), "sql/install.sql is stale: run `make install-sql`"
    check = subprocess.run([sys.executable, "-m", "pyworker.db.installsql", "--check"], cwd=ROOT)
    assert check.returncode == 0


def test_install_sql_twice_gives_the_same_api_as_migrate(scratch_database: str, database_url: str) -> None:
    first = _psql_install(scratch_database)
    assert first.returncode == 0, first.stderr
    second = _psql_install(scratch_database)
    assert second.returncode == 0, second.stderr
    assert _api(scratch_database) == _api(database_url)
    with psycopg.connect(scratch_database) as conn:
        assert conn.execute("SELECT runrow.schema_version()").fetchone() == (
            conn.execute("SELECT max(migration_id) FROM runrow._yoyo_migration").fetchone()
        )
    # runrow migrate after install.sql finds nothing to apply.
    assert migrate(scratch_database).applied == []


def test_concurrent_migrates_on_an_empty_database(scratch_database: str) -> None:
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda _: migrate(scratch_database), range(3)))
    applied = sorted(len(r.applied) for r in results)
    assert applied[0] == 0 and applied[-1] > 0, "exactly one migrate applied the migrations"
    assert sum(1 for r in results if r.applied) == 1
    # install.sql on top of a migrated database succeeds and changes nothing.
    assert _psql_install(scratch_database).returncode == 0


# Functions a migration defined before functions/ took them over. functions/ is applied after the
# migrations on every migrate, so a later migration that restated one of these would be
# overwritten on the same migrate: its change would never land.
DEFINED_BY_MIGRATIONS_BEFORE_FUNCTIONS = {
    "_agent_run_settings": {"0034", "0050", "0052", "0065"},
    "_json_probe": {"0010"},
    # A CHECK needed it when 0067 ran; since 0081 a trigger looks it up when it fires.
    "_schedule_name_ok": {"0067"},
    # 0085's triggers call it from their first row on, before functions/ is applied.
    "_printable": {"0085"},
}


def test_no_migration_restates_a_function_that_functions_defines() -> None:
    defines = re.compile(r"CREATE (?:OR REPLACE )?FUNCTION runrow\.(\w+)\(")
    in_functions = {name for path in function_files() for name in defines.findall(path.read_text())}
    restated: dict[str, set[str]] = {}
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        for name in set(defines.findall(path.read_text())) & in_functions:
            restated.setdefault(name, set()).add(path.name[:4])
    assert restated == DEFINED_BY_MIGRATIONS_BEFORE_FUNCTIONS, (
        "a migration defines a function that functions/ also defines; change it in functions/ instead"
    )


def test_migrate_refuses_a_database_that_is_not_utf8_before_writing_anything(superuser_url: str) -> None:
    """A LATIN1 database took every migration and then failed in functions/ ("character ... has
    no equivalent in encoding LATIN1"): runrow's rules name Unicode characters. Refused up front,
    saying how to create one that works, with nothing written."""
    name = f"runrow_latin1_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(superuser_url, autocommit=True) as admin:
        admin.execute(
            f'CREATE DATABASE "{name}" ENCODING LATIN1 TEMPLATE template0 LC_COLLATE "C" LC_CTYPE "C"'
        )
    url = database_url_for(superuser_url, name)
    try:
        with pytest.raises(MigrateError, match="encoding is LATIN1; runrow needs UTF8"):
            migrate(url)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'runrow'").fetchone() == (
                0,
            )
    finally:
        with psycopg.connect(superuser_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
