"""A pool that is only busy is not a database that is down (the serve audit).

A session held a row lock on a run and 30 concurrent POST /runs/{id}/cancel held every pooled
connection waiting on it: GET /healthz answered 503 "the database is unavailable" after 2 s, a
scrape waited 4.5 s of its 5 for a connection, with the database itself fine. Now /healthz and
/metrics have a connection of their own, and a request that waited out the pool says that all
its connections are busy, not that the database is unavailable.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from http_support import ALICE, Server, private_database, serve
from worker_support import wait_until

POOL = 2
CANCELS = 3 * POOL  # each waits out cancel_run's 5 s lock_timeout, POOL at a time: ~15 s busy


@pytest.fixture(scope="module")
def busy_db(database_url: str) -> Iterator[str]:
    yield from private_database(database_url, "runrow_http_pool_busy")


@pytest.fixture
def server(busy_db: str) -> Iterator[Server]:
    # A request waits 1.5 s for a connection, well within the 5 s the cancels hold theirs.
    yield from serve(busy_db, pool_max_size=POOL, pool_timeout=1.5)


def test_health_and_metrics_answer_while_every_request_connection_waits_on_a_lock(
    busy_db: str, server: Server
) -> None:
    with httpx.Client(base_url=server.url, headers=ALICE, timeout=30) as client:
        made = client.post(f"/conversations/{uuid.uuid4()}/runs", json={"content": "hi", "start_in": 3600})
        run_id = made.json()["run_id"]
        with psycopg.connect(busy_db) as holder:
            holder.execute("SELECT 1 FROM runrow.agent_run WHERE id = %s FOR UPDATE", (run_id,))
            cancels: list[int] = []

            def cancel() -> None:
                cancels.append(client.post(f"/runs/{run_id}/cancel").status_code)

            threads = [threading.Thread(target=cancel) for _ in range(CANCELS)]
            for thread in threads:
                thread.start()
            # Every request connection is lent out, to a cancel waiting on the lock.
            with psycopg.connect(busy_db, autocommit=True) as watcher:
                blocked = (
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )

                def all_blocked() -> bool:
                    row = watcher.execute(blocked).fetchone()
                    return row is not None and row[0] >= POOL

                wait_until(all_blocked, 10, "every pooled connection to wait on the lock")
            health = client.get("/healthz")
            scrape = client.get("/metrics")
            # Queued behind the cancels still waiting for a connection: it waits the pool out
            # (1.5 s) before the first cancel gives up (its 5 s lock_timeout).
            read = client.get(f"/runs/{run_id}")
            holder.rollback()
            for thread in threads:
                thread.join(30)
    assert health.status_code == 200 and health.json()["ok"] is True, health.text
    assert "runrow_db_up 1.0" in scrape.text.splitlines(), [
        line for line in scrape.text.splitlines() if "db_up" in line
    ]
    assert read.status_code == 503, read.text
    error = read.json()["error"]
    assert error["type"] == "busy" and f"all {POOL} " in error["message"], error
    assert "unavailable" not in error["message"], error
    assert read.headers["Retry-After"] == "1"
    assert len(cancels) == CANCELS


def test_health_answers_while_a_scrape_waits_on_the_database(busy_db: str, server: Server) -> None:
    """The review of stop 59: with one probe connection, a scrape slow on a loaded database
    (here: queue_metrics waiting on a lock of agent_run) held it, and /healthz answered 503
    "database unavailable" after 2 s while the database answered everything else."""
    with httpx.Client(base_url=server.url, headers=ALICE, timeout=30) as client:
        with psycopg.connect(busy_db) as holder:
            holder.execute("LOCK TABLE runrow.agent_run IN ACCESS EXCLUSIVE MODE")
            scraped: list[httpx.Response] = []
            scrape = threading.Thread(target=lambda: scraped.append(client.get("/metrics")))
            scrape.start()
            with psycopg.connect(busy_db, autocommit=True) as watcher:
                waiting = (
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND application_name = 'runrow-serve-probe'"
                )

                def scrape_waits() -> bool:
                    row = watcher.execute(waiting).fetchone()
                    return row is not None and row[0] >= 1

                wait_until(scrape_waits, 10, "the scrape to wait on the lock")
            health = client.get("/healthz")
            holder.rollback()
            scrape.join(30)
    assert health.status_code == 200 and health.json()["ok"] is True, health.text
    assert scraped and scraped[0].status_code == 200
