"""A worker the server refuses for want of connection slots (SQLSTATE 53300: max_connections,
the reserved slots, a role's CONNECTION LIMIT) says so when it gives up at start.

It waited its start-up budget logging an INFO line every 0.5 s, then exited 2 with "cannot
connect to the database within 30 s; check DATABASE_URL ... that the server is up", which
named neither the refusal nor max_connections. A role with CONNECTION LIMIT 0 is refused with
"too many connections for role", the same SQLSTATE, without filling a shared server."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pyworker.db.cancel_safe_pool import CancelSafePool
from pyworker.db.retry import DatabaseUnavailable, Retry

# The worker's start-up budget, shortened in the child (START_TIMEOUT is read at start).
BUDGET = 4
RUN_WORKER = (
    "import sys; import pyworker.worker.process as p; p.START_TIMEOUT = float(sys.argv.pop(1)); "
    "from pyworker.cli.main import main; raise SystemExit(main())"
)


@pytest.fixture
def no_slots_url(database_url: str, superuser_url: str) -> Iterator[str]:
    """A login the server always refuses with 53300 (its CONNECTION LIMIT is 0)."""
    role = f"runrow_no_slots_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(superuser_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 0')
        try:
            yield make_conninfo(database_url, user=role)
        finally:
            conn.execute(f'DROP ROLE "{role}"')


def test_a_worker_out_of_connection_slots_names_the_refusal_and_max_connections(no_slots_url: str) -> None:
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    # The agent handler starts only with a model to call (runrow worker's check): a key that is
    # never used, so what stops the worker is the database.
    environ["ANTHROPIC_API_KEY"] = "test-key"
    worker = subprocess.run(
        [sys.executable, "-c", RUN_WORKER, str(BUDGET), "--database-url", no_slots_url, "worker"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=BUDGET + 30,
    )
    lines = worker.stderr.strip().splitlines()
    assert worker.returncode == 2, worker.stderr
    assert "Traceback" not in worker.stderr
    last = lines[-1]
    assert last.startswith("runrow worker: "), worker.stderr
    assert "too many connections for role" in last and "max_connections" in last, last
    assert f"within {BUDGET} s" in last, last
    # One line for a wait that goes on, not one every half second.
    waits = [line for line in lines if "waiting for the database" in line]
    assert 1 <= len(waits) <= 2, waits


async def test_a_pool_timeout_while_running_names_the_refusal(no_slots_url: str) -> None:
    """While running, "couldn't get a connection after 9.00 sec" was all a worker said: the
    same for a server out of slots, one that is down, or a pool held busy."""
    pool = CancelSafePool(no_slots_url, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False)
    await pool.open(wait=False)
    try:
        with pytest.raises(DatabaseUnavailable) as gave_up:
            await Retry(1.5, logging.getLogger("test")).call(
                pool, lambda conn: conn.execute("SELECT 1"), "probe"
            )
    finally:
        await pool.close()
    assert "too many connections for role" in str(gave_up.value), gave_up.value
