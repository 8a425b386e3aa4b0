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
