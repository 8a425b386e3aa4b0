"""`runrow migrate`: yoyo migrations, then every file in functions/, under one lock.

The migrations in migrations/ are the only DDL history. functions/ holds the API as
CREATE OR REPLACE files and is re-applied on every migrate, so editing a function and
migrating updates it without a new migration. Two migrates started at once serialize on
an advisory lock taken before yoyo touches anything, so they never race on yoyo's own
bookkeeping tables either. The lock is transaction-scoped, held by a transaction left open for
the whole migrate: a session lock taken through a transaction pooler stays behind on whichever
server connection took it, its unlock lands on another one, and every later migrate waits on it
forever.

A migrate through a transaction pooler is refused before it writes anything: yoyo sets
search_path and this module lock_timeout per session, and through a pooler those settings stay
on whichever server connections yoyo used, for the pooler's other clients to inherit (the
pooler audit); with a pool of one server connection the migrate waited forever for a second.
The pooler is told apart the way the workers tell it (pooling.py): it refuses the `options`
startup parameter, or accepts and drops it. sql/install.sql is one transaction and works
through a pooler.

A migration waits at most LOCK_TIMEOUT for a table lock, then is rolled back and tried again
(LOCK_ATTEMPTS in all): an ALTER TABLE queued behind a long transaction (a report, a pg_dump)
holds up every claim, heartbeat and enqueue queued behind it, so the fleet stalled for as long
as that transaction ran (the DBA audit: 19 s behind a 20 s report, claims cancelled by their
statement_timeout). And yoyo's own lock row is cleared first: under the advisory lock no other
migrate runs, so a row there is stale (a migrate killed mid-way, or one a pg_dump caught and a
restore brought back), and yoyo waited on it and failed with a traceback.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from yoyo import read_migrations
from yoyo.backends.core.postgresql import PostgresqlPsycopgBackend
from yoyo.connections import default_migration_table, parse_uri
from yoyo.exceptions import LockTimeout

from pyworker.db.paths import FUNCTIONS_DIR, MIGRATIONS_DIR
from pyworker.db.pooling import POOLER_SAFE, REFUSED_OPTIONS

log = logging.getLogger("runrow.migrate")

# pg_advisory_lock key shared by `runrow migrate` and sql/install.sql: hashtext('runrow.migrate').
LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtext('runrow.migrate'))"
YOYO_SCHEMA = "runrow"
LOCK_TIMEOUT = "5s"  # the longest a migration's statement waits for a lock (install.sql's too)
LOCK_ATTEMPTS = 3


class MigrateError(RuntimeError):
    """A migration or function file failed to apply; nothing of this migrate was kept."""


@dataclass
class MigrateResult:
    applied: list[str]
    functions: list[str]
    version: str


def function_files(directory: Path = FUNCTIONS_DIR) -> list[Path]:
    """Function files in apply order: private helpers (leading underscore) first."""
    return sorted(directory.glob("*.sql"), key=lambda p: (not p.name.startswith("_"), p.name))


def yoyo_uri(database_url: str) -> str:
    """The DATABASE_URL as yoyo wants it: psycopg 3 driver, bookkeeping in schema runrow."""
    parts = urlsplit(database_url)
    query = dict(parse_qsl(parts.query))
    query["schema"] = YOYO_SCHEMA
    return urlunsplit(("postgresql+psycopg", parts.netloc, parts.path, urlencode(query), ""))


class _Backend(PostgresqlPsycopgBackend):
    """yoyo's psycopg 3 backend with LOCK_TIMEOUT on every session it opens (it applies each
    migration on a connection of its own, made by copy()). Sessions are the server's own:
    migrate refuses a pooler first (_refuse_a_pooler)."""

    def init_connection(self, connection: Any) -> None:
        super().init_connection(connection)
        connection.cursor().execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")

    def apply_one(self, migration: Any, force: bool = False, mark: bool = True) -> None:
        """yoyo's, with the migration and the row that records it committed together. yoyo
        commits the migration on its own connection, then records it in a second transaction: a
        migrate killed between the two left it applied and unrecorded, and every later migrate
        failed on the objects it had already made."""
        migration.load()
        if not migration.use_transactions:
            super().apply_one(migration, force=force, mark=mark)
            return
        self.ensure_internal_schema_updated()
        with self.copy() as backend, backend.transaction():
            migration.process_steps(backend, "apply", force=force)
            backend.log_migration(migration, "apply")
            if mark:
                backend.mark_one(migration, log=False)


POOLED = (
    "DATABASE_URL goes through a connection pooler (it refused or dropped the `options` startup "
    "parameter): a migration's session settings would stay on the pooler's server connections for "
    "its other clients. Run `runrow migrate` with the database's direct URL, or `psql -f "
    "sql/install.sql` (one transaction, fine through a pooler); README, Deployment"
)


def _refuse_a_pooler(database_url: str, timeout: dict[str, Any]) -> None:
    """MigrateError when `database_url` goes through a pooler: the server sees the options a
    client sends at connect time, and pgbouncer refuses them or, told to ignore them, drops them."""
    given = conninfo_to_dict(database_url).get("options") or ""
    options = f"{given} -c lock_timeout={LOCK_TIMEOUT}".strip()
    try:
        with psycopg.connect(database_url, autocommit=True, options=options, **timeout, **POOLER_SAFE) as c:
            seen = c.execute("SHOW lock_timeout").fetchone()[0]  # type: ignore[index]
    except psycopg.OperationalError as exc:
        if REFUSED_OPTIONS in str(exc):
            raise MigrateError(POOLED) from None
        raise
    if seen != LOCK_TIMEOUT:
        raise MigrateError(POOLED)


def _refuse_a_non_utf8_database(conn: psycopg.Connection[Any]) -> None:
    """MigrateError unless the database's encoding is UTF8, before anything is written: runrow's
    rules name Unicode characters (white space, control characters) that other encodings cannot
    hold, and a conversation's text needs them too. Found by trying: a LATIN1 database took
    every migration and then failed in functions/ ("character ... has no equivalent")."""
    encoding = conn.execute("SHOW server_encoding").fetchone()[0]  # type: ignore[index]
    if encoding != "UTF8":
        raise MigrateError(
            f"this database's encoding is {encoding}; runrow needs UTF8: create the database with "
            "ENCODING 'UTF8' (CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0) and migrate that"
        )


def _refuse_a_newer_schema(backend: Any, migrations: Any, conn: psycopg.Connection[Any]) -> None:
    """MigrateError when a newer runrow migrated this database: re-applying this code's
    functions/ would put older functions back (the rolling-deploy audit: an old migrate job
    during a rollout exited 0, "already current", and priced 1-hour cache writes at the old
    rate again)."""
    known = {m.hash for m in migrations}
    unknown = [h for h in backend.get_applied_migration_hashes() if h not in known]
    if not unknown:
        return
    version = conn.execute("SELECT runrow.schema_version()").fetchone()[0]  # type: ignore[index]
    raise MigrateError(
        f"this database has {len(unknown)} migration(s) this runrow does not ship (it is at {version}; "
        f"this runrow's newest is {max(m.id for m in migrations)}): a newer runrow migrated it, and this "
        "one would put older functions back. Run the newer version's `runrow migrate`"
    )


def _backend(database_url: str) -> _Backend:
    backend = _Backend(parse_uri(yoyo_uri(database_url)), default_migration_table)
    backend.init_database()
    return backend


def migrate(
    database_url: str, migrations_dir: Path = MIGRATIONS_DIR, functions_dir: Path = FUNCTIONS_DIR
) -> MigrateResult:
    # Not autocommit: the lock lives as long as lock_conn's transaction, which writes nothing.
    # A bounded connect, as every other command's: a port that accepts and never answers hung here.
    timeout = {} if "connect_timeout" in conninfo_to_dict(database_url) else {"connect_timeout": 10}
    _refuse_a_pooler(database_url, timeout)
    with psycopg.connect(database_url, **timeout, **POOLER_SAFE) as lock_conn:
        _refuse_a_non_utf8_database(lock_conn)
        lock_conn.execute(LOCK_SQL)
        try:
            # yoyo keeps its tables in our schema, which must exist (committed) before it connects.
            with psycopg.connect(database_url, autocommit=True, **POOLER_SAFE) as conn:
                conn.execute("CREATE SCHEMA IF NOT EXISTS runrow")
            backend = _backend(database_url)
            backend.break_lock()  # yoyo's own: any row of its lock table is stale (module docstring)
            migrations = read_migrations(str(migrations_dir))
            _refuse_a_newer_schema(backend, migrations, lock_conn)
            applied = _apply(backend, migrations)
            backend.connection.close()
            files = function_files(functions_dir)
            with psycopg.connect(database_url, **POOLER_SAFE) as conn, conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                for path in files:
                    try:
                        conn.execute(path.read_text())  # type: ignore[arg-type]
                    except psycopg.Error as exc:
                        raise MigrateError(f"functions/{path.name}: {exc}") from exc
                version = conn.execute("SELECT runrow.schema_version()").fetchone()[0]  # type: ignore[index]
            for mid in applied:  # one line each at DEBUG: the summary is `runrow migrate`'s to print
                log.debug("applied migration %s", mid)
        finally:
            lock_conn.rollback()  # ends the transaction and with it the lock
    return MigrateResult(applied=applied, functions=[p.stem for p in files], version=version)


def _apply(backend: Any, migrations: Any) -> list[str]:
    """Apply the pending migrations; their ids. A migration that waited out LOCK_TIMEOUT for a
    lock is rolled back and tried again, LOCK_ATTEMPTS times in all (the ones before it stay
    applied: yoyo commits each on its own)."""
    todo = [m.id for m in backend.to_apply(migrations)]
    for attempt in range(1, LOCK_ATTEMPTS + 1):
        try:
            with backend.lock():
                backend.apply_migrations(backend.to_apply(migrations))
        except psycopg.errors.LockNotAvailable as exc:
            if attempt == LOCK_ATTEMPTS:
                raise MigrateError(
                    f"a migration waited {LOCK_TIMEOUT} for a lock {LOCK_ATTEMPTS} times and was rolled back "
                    f"({exc.diag.message_primary}): a long transaction holds one of its tables (a report, "
                    "a pg_dump?); run `runrow migrate` again once it has ended"
                ) from exc
            log.warning(
                "a migration waited %s for a lock; trying again (%s)", LOCK_TIMEOUT, exc.diag.message_primary
            )
            time.sleep(attempt)
        except LockTimeout as exc:
            raise MigrateError(f"yoyo's migration lock is held: {exc}") from exc
        except psycopg.Error as exc:
            raise MigrateError(f"migration failed, nothing of it was kept: {exc}") from exc
        else:
            return todo
    raise AssertionError("unreachable")
