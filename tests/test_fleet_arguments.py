"""enqueue_run's fleet arguments and release_run's retry_in, through the Python surface.

A delayed run (start_in) or a backed-off one (retry_in) is nobody's to claim yet, so neither
sends the dispatchers' wake-up: a notifying commit wakes every listening backend of the
database (issue 11), for a claim that would find nothing. Notifications are delivered only on
commit, so this is checked with a real LISTEN session.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from decimal import Decimal

import psycopg
from race_support import Connect, claim, database_url, drain, owner, run_row

from pyworker.db import api

__all__ = ["database_url", "owner"]


def wakes(listen: psycopg.Connection) -> list[str]:
    return [n.payload for n in listen.notifies(timeout=0.5)]


def enqueue(url: str, conversation: uuid.UUID, **fleet: object) -> uuid.UUID:
    async def go() -> uuid.UUID:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            done = await api.enqueue_run(
                conn, conversation, "hi", "claude-x", user_id="u1", fleet=api.FleetOptions(**fleet)
            )
            return done.run_id

    return asyncio.run(go())


def release(url: str, run: dict, retry_in: timedelta | None) -> str | None:
    async def go() -> str | None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            return await api.release_run(conn, run["run_id"], run["claim_token"], "429", retry_in=retry_in)

    return asyncio.run(go())


def test_fleet_options_are_stored(owner: psycopg.Connection, database_url: str) -> None:
    run = enqueue(
        database_url,
        uuid.uuid4(),
        start_in=timedelta(seconds=30),
        priority=5,
        fairness_key="org-1",
        concurrency_key="heavy",
        rate_limit_key="key-2",
        token_budget=2000,
        cost_budget=Decimal("0.50"),
        webhook_url="http://127.0.0.1:9/hook",
    )
    row = run_row(owner, run)
    delay = owner.execute("SELECT not_before - now() FROM runrow.agent_run WHERE id = %s", (run,)).fetchone()[
        0
    ]
    assert timedelta(seconds=29) < delay <= timedelta(seconds=30)
    assert (row["priority"], row["fairness_key"], row["concurrency_key"], row["rate_limit_key"]) == (
        5,
        "org-1",
        "heavy",
        "key-2",
    )
    assert (row["token_budget"], row["cost_budget"], row["webhook_url"]) == (
        2000,
        Decimal("0.50"),
        "http://127.0.0.1:9/hook",
    )


def test_a_delayed_enqueue_wakes_nobody_an_immediate_one_does(
    owner: psycopg.Connection, connect: Connect, database_url: str
) -> None:
    listen = connect()
    listen.execute("LISTEN runrow_enqueued")
    delayed = uuid.uuid4()
    enqueue(database_url, delayed, start_in=timedelta(minutes=5))
    assert wakes(listen) == []
    now = uuid.uuid4()
    enqueue(database_url, now)
    assert wakes(listen) == [str(now)]


def test_a_backoff_release_wakes_nobody_a_plain_one_does(
    owner: psycopg.Connection, connect: Connect, database_url: str
) -> None:
    drain(owner)
    enqueue(database_url, uuid.uuid4())
    owner.execute("UPDATE runrow.agent_run SET max_attempts = 3 WHERE status = 'queued'")
    (run,) = claim(owner, 1)
    listen = connect()
    listen.execute("LISTEN runrow_enqueued")
    assert release(database_url, run, timedelta(seconds=30)) == "requeued"
    assert wakes(listen) == []
    assert run_row(owner, run["run_id"])["not_before"] is not None

    owner.execute("UPDATE runrow.agent_run SET not_before = NULL WHERE id = %s", (run["run_id"],))
    (again,) = claim(owner, 1)
    assert release(database_url, again, None) == "requeued"
    assert wakes(listen) == [str(run_row(owner, run["run_id"])["conversation_id"])]
