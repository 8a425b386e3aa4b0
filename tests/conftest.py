"""Shared fixtures: a real PostgreSQL for the whole session.

With DATABASE_URL set (as `make test` does through `runrow db run`), tests use that
database; otherwise they start a private throwaway cluster of their own. Either way the
schema is brought current with `runrow migrate` once per session.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import psycopg
import psycopg.conninfo
import pytest

from pyworker.db import devdb
from pyworker.db.migrate import migrate

# This xdist worker's own database, held open from pytest_configure to pytest_unconfigure.
_WORKER_DATABASE = contextlib.ExitStack()


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist with DATABASE_URL set, each worker process gets a database of its own
    on that server and points DATABASE_URL (and RUNROW_SUPERUSER_URL) at it before any test
    reads them, so the workers, services and queues one process's tests start never see the
    other process's runs. Not migrated here: the session fixture migrates whatever DATABASE_URL
    names, as it does without xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    url = os.environ.get("DATABASE_URL")
    if not worker or not url:
        return
    own = _WORKER_DATABASE.enter_context(
        devdb.temporary_database(url, f"runrow_test_{worker}", migrated=False)
    )
    os.environ["DATABASE_URL"] = own
    superuser = os.environ.get("RUNROW_SUPERUSER_URL")
    if superuser:
        os.environ["RUNROW_SUPERUSER_URL"] = devdb.database_url_for(
            superuser, psycopg.conninfo.conninfo_to_dict(own)["dbname"]
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    _WORKER_DATABASE.close()
    # The migrated template the test processes copied their databases from (devdb), once they
    # are all done: this is the controlling process (or the only one).
    url = os.environ.get("DATABASE_URL")
    if url and not os.environ.get("PYTEST_XDIST_WORKER"):
        with contextlib.suppress(psycopg.Error):
            devdb.drop_templates(url)


@pytest.fixture(scope="session")
def cluster_urls() -> Iterator[tuple[str, str]]:
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url, os.environ.get("RUNROW_SUPERUSER_URL", url)
        return
    with devdb.throwaway() as cluster:
        yield cluster.url, cluster.superuser_url


@pytest.fixture(scope="session")
def database_url(cluster_urls: tuple[str, str]) -> str:
    url = cluster_urls[0]
    migrate(url)
    return url


@pytest.fixture(scope="session")
def superuser_url(cluster_urls: tuple[str, str], database_url: str) -> str:
    return cluster_urls[1]


@pytest.fixture
def connect(database_url: str) -> Iterator[object]:
    """Open autocommit connections as the runrow owner; all are closed after the test."""
    opened: list[psycopg.Connection] = []

    def _connect(autocommit: bool = True) -> psycopg.Connection:
        conn = psycopg.connect(database_url, autocommit=autocommit)
        opened.append(conn)
        return conn

    yield _connect
    for conn in opened:
        conn.close()


@pytest.fixture
def scratch_database(database_url: str) -> Iterator[str]:
    """An empty database of its own, for install tests; dropped afterwards."""
    with devdb.temporary_database(database_url, "runrow_scratch", migrated=False) as url:
        yield url
