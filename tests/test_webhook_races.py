"""The outbox under concurrent connections, in fixed interleavings: a delivery becomes visible
exactly when the run's ending does (never a committed ending without its delivery, never a
delivery of an ending that rolled back), and two claimers never share a delivery, nor does one
wait for the other."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.types.json import Jsonb
from worker_support import worker_db

__all__ = ["worker_db"]

HOOK = "http://127.0.0.1:9/hook"


@pytest.fixture
def conns(worker_db: str) -> Iterator[tuple[psycopg.Connection, psycopg.Connection]]:
    with psycopg.connect(worker_db) as a, psycopg.connect(worker_db, autocommit=True) as b:
        # A claim that waited on the other session's lock would hit this instead of returning.
        b.execute("SET lock_timeout = '2s'")
        yield a, b


def running_hooked(conn: psycopg.Connection) -> tuple[uuid.UUID, uuid.UUID]:
    conn.execute(
        "SELECT runrow.enqueue_run(conversation_id => %s, content => %s, model => 'm', webhook_url => %s)",
        (uuid.uuid4(), Jsonb("hi"), HOOK),
    )
    row = conn.execute("SELECT run_id, claim_token FROM runrow.claim_run(worker_id => 'w')").fetchone()
    assert row is not None
    return row[0], row[1]


def seen(conn: psycopg.Connection, run_id: uuid.UUID) -> tuple[str, int]:
    """The run's status and its deliveries, read in one snapshot."""
    row = conn.execute(
        "SELECT status, (SELECT count(*) FROM runrow.webhook_delivery AS w WHERE w.run_id = a.id)::int "
        "FROM runrow.agent_run AS a WHERE a.id = %s",
        (run_id,),
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def claim(conn: psycopg.Connection, worker: str) -> list[tuple[uuid.UUID, uuid.UUID]]:
    return conn.execute(
        "SELECT delivery_id, run_id FROM runrow.claim_webhook_deliveries(worker_id => %s)",
        (worker,),
    ).fetchall()


def test_the_delivery_commits_and_rolls_back_with_the_ending(
    conns: tuple[psycopg.Connection, psycopg.Connection],
) -> None:
    a, b = conns
    run_id, token = running_hooked(a)
    a.commit()
    # A's finish, not committed yet: B sees neither the ending nor a delivery to claim.
    a.execute(
        "SELECT runrow.finish_run(run_id => %s, claim_token => %s, status => 'completed')", (run_id, token)
    )
    assert seen(b, run_id) == ("running", 0)
    assert claim(b, "b") == []
    a.rollback()
    assert seen(b, run_id) == ("running", 0), "an ending that rolled back leaves no delivery"
    a.execute(
        "SELECT runrow.finish_run(run_id => %s, claim_token => %s, status => 'completed')", (run_id, token)
    )
    a.commit()
    assert seen(b, run_id) == ("completed", 1), "the committed ending carries its delivery"
    assert [r for _, r in claim(b, "b")] == [run_id]


def test_two_claimers_never_share_a_delivery_and_never_wait_for_each_other(
    conns: tuple[psycopg.Connection, psycopg.Connection],
) -> None:
    a, b = conns
    run_id, token = running_hooked(a)
    a.execute(
        "SELECT runrow.finish_run(run_id => %s, claim_token => %s, status => 'failed')", (run_id, token)
    )
    a.commit()
    taken = claim(a, "a")  # A's claim holds the row lock until A commits
    assert [r for _, r in taken] == [run_id]
    assert claim(b, "b") == [], "B skips the row A holds (lock_timeout would have fired had it waited)"
    a.commit()
    assert claim(b, "b") == [], "and after A commits the lease keeps it A's"
    holder = b.execute(
        "SELECT worker_id, attempts FROM runrow.webhook_delivery WHERE id = %s", (taken[0][0],)
    ).fetchone()
    assert holder == ("a", 1)
