"""The schema version this code needs, and what to say when a database is not at it.

A fleet is upgraded one piece at a time, and the order that works is migrate first, then roll
out workers and services: old code runs on a newer schema (migrations keep the functions it
calls), but new code on an older schema calls functions that are not there yet. A new worker
started before the migrate ran, and then failed or released runs mid-way on the first
function it lacked (the rolling-deploy audit: an empty model turn ended `dead` after three
paid attempts on `runrow.record_usage` missing). So the worker and the service refuse to
start on a database older than the newest migration they ship, and `runrow migrate` and
install.sql refuse a database newer than theirs, which they would downgrade (functions/ is
re-applied on every migrate).
"""

from __future__ import annotations

from pathlib import Path

from pyworker.db.paths import MIGRATIONS_DIR


def migration_files(directory: Path = MIGRATIONS_DIR) -> list[Path]:
    """The migration files in `directory`, in apply order (rollback scripts left out)."""
    return sorted(p for p in directory.glob("*.sql") if not p.name.endswith(".rollback.sql"))


def shipped_migrations() -> list[str]:
    """The migration ids this code ships, in order."""
    return [p.stem for p in migration_files()]


def required_version() -> str:
    """The newest migration this code ships: the schema it needs."""
    return shipped_migrations()[-1]


def _number(version: str) -> int:
    head = version.split("_", 1)[0]
    return int(head) if head.isdigit() else -1


def too_old(version: str | None, what: str = "this runrow") -> str | None:
    """Why a database whose runrow.schema_version() is `version` is too old for this code; None
    when it is at or past it."""
    needed = required_version()
    if version is not None and _number(version) >= _number(needed):
        return None
    return (
        f"the database's schema is {version}, older than {what} needs ({needed}): run `runrow migrate` "
        "with this version first (upgrade order: migrate, then workers and services)"
    )
