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


def ended_hooked(conn: psycopg.Connection, url: str, n: int) -> None:
    """n runs with webhook `url`, ended: n deliveries due, committed."""
    for _ in range(n):
        conn.execute(
            "SELECT runrow.enqueue_run(conversation_id => %s, content => %s, model => 'm', "
            "webhook_url => %s)",
            (uuid.uuid4(), Jsonb("hi"), url),
        )
    conn.execute(
        "SELECT runrow.finish_run(c.run_id, c.claim_token, 'completed') "
        "FROM runrow.claim_runs('w', %s, 60) AS c",
        (n,),
    )
    conn.commit()


def claim_capped(conn: psycopg.Connection, worker: str, max_deliveries: int = 10) -> list[str]:
    """The URLs a claim with the default cap (4 per receiver) leased."""
    rows = conn.execute(
        "SELECT url FROM runrow.claim_webhook_deliveries(worker_id => %s, max_deliveries => %s)",
        (worker, max_deliveries),
    ).fetchall()
    return [url for (url,) in rows]


def leased(conn: psycopg.Connection, url: str) -> int:
    row = conn.execute(
        "SELECT count(*)::int FROM runrow.webhook_delivery WHERE url = %s AND claim_token IS NOT NULL", (url,)
    ).fetchone()
    assert row is not None
    return row[0]


CROWDED = "http://hooks.example:8080/crowded"
OTHER = "http://other.example/hook"


def test_two_claims_at_once_never_lease_past_a_receivers_cap_together(
    conns: tuple[psycopg.Connection, psycopg.Connection],
) -> None:
    """A's claim has leased the receiver's 4 and not committed: B's count cannot see those leases,
    so without the receiver's lock B leased 4 more (8 in flight to a receiver capped at 4). B now
    passes the receiver over without waiting for A (B's lock_timeout would fire) and still gets
    another receiver's delivery; once A has committed, B's count sees A's 4."""
    a, b = conns
    ended_hooked(a, CROWDED, 10)
    ended_hooked(a, OTHER, 1)
    assert claim_capped(a, "a", 4) == [CROWDED] * 4  # A's transaction stays open
    assert claim_capped(b, "b") == [OTHER], "B passes the receiver A is leasing to, and takes the other"
    a.commit()
    assert claim_capped(b, "b") == [], "A's 4 leases fill the receiver"
    assert leased(b, CROWDED) == 4


def test_a_claim_after_another_commits_takes_only_the_room_left(
    conns: tuple[psycopg.Connection, psycopg.Connection],
) -> None:
    """A leases 2 of the receiver's 4 and holds its transaction open; B's claim meanwhile leases
    none of it (it would have counted 0 leases and taken 4: 6 in flight). After A commits, B
    takes the 2 left, and a third claim none."""
    a, b = conns
    ended_hooked(a, CROWDED, 10)
    assert claim_capped(a, "a", 2) == [CROWDED] * 2
    assert claim_capped(b, "b") == []
    a.commit()
    assert claim_capped(b, "b") == [CROWDED] * 2
    assert claim_capped(b, "b") == []
    assert leased(b, CROWDED) == 4
