"""Where to find the database: DATABASE_URL, or the running `runrow db start` cluster."""

from __future__ import annotations

import os

from pyworker.db import devdb


class ConfigError(RuntimeError):
    """Configuration is missing or wrong; the message says what to do."""


def database_url(explicit: str | None = None) -> str:
    """The URL given (an explicit one that is blank is an error, never a fall back to another
    database), else DATABASE_URL, else the running `runrow db start` cluster. DATABASE_URL set to
    white space only counts as unset, as `export DATABASE_URL=` means: what it falls back to is
    this folder's throwaway cluster, never a server named somewhere else."""
    if explicit is not None:
        if not explicit.strip():
            raise ConfigError(
                "--database-url is empty (an unset shell variable?): give a URL or leave the option out"
            )
        return explicit
    env = env_database_url()
    if env is not None:
        return env
    cluster = devdb.load_state()
    if cluster is not None:
        return cluster.url
    raise ConfigError(
        "no database: set DATABASE_URL (for example postgresql://user@host/db), pass "
        "--database-url, or start a throwaway cluster with `runrow db start`."
    )


def env_database_url() -> str | None:
    """DATABASE_URL, or None when it is unset, empty or white space only."""
    env = os.environ.get("DATABASE_URL")
    return env if env and env.strip() else None


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
