"""Where to find the database: DATABASE_URL, or the running `runrow db start` cluster."""

from __future__ import annotations

import os

from pyworker.db import devdb


class ConfigError(RuntimeError):
    """Configuration is missing or wrong; the message says what to do."""


def database_url(explicit: str | None = None) -> str:
    if explicit:
        return explicit
    env = os.environ.get("DATABASE_URL")
    if env:
        return env
    cluster = devdb.load_state()
    if cluster is not None:
        return cluster.url
    raise ConfigError(
        "no database: set DATABASE_URL (for example postgresql://user@host/db), pass "
        "--database-url, or start a throwaway cluster with `runrow db start`."
    )


def where(conninfo: str) -> str:
    """host:port/dbname of a URL or conninfo string, for a log line: never its password."""
    from psycopg import Error
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(conninfo)
    except Error:
        return "the database (its URL does not parse)"
    host = str(parts.get("host") or parts.get("hostaddr") or "the local socket")
    port = str(parts.get("port") or "5432")
    return f"{host}:{port}/{parts.get('dbname') or parts.get('user') or ''}"
