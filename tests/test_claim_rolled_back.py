"""A claim whose final statement fails and is caught returns nothing.

_claim catches the errors its final statement can raise (a collision with the turn-order guard,
a concurrency limit or invariant 1: 40001, 23514, 23505) and claims nothing that round. But
PL/pgSQL keeps the rows a RETURN QUERY has already handed over when the statement then fails
and the function's own handler catches the error, and the statement's journal INSERT and its
AFTER triggers run after the rows are out. So the claim returned runs and claim tokens that the
rollback had taken back, and a worker would have started runs it did not hold.

The interleaving, forced with real sessions (race_support): a superuser session holds,
uncommitted, the journal row that the claim of the queued run will write next (the seq its
guard will pick); the claimer locks the run, blocks in its journal INSERT, and fails with
23505 once the holder commits. Every failure the handler catches takes the same path.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from race_support import (
    Background,
    Connect,
    claim,
    database_url,
    enqueue,
    journal,
    owner,
    run_row,
    superuser_on,
)

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer


@pytest.fixture
def superuser(database_url: str, cluster_urls: tuple[str, str]) -> Iterator[psycopg.Connection]:
    url = superuser_on(database_url, cluster_urls)
    with psycopg.connect(url) as conn:
        yield conn


def test_a_claim_whose_final_statement_fails_returns_no_run(
    owner: psycopg.Connection, connect: Connect, superuser: psycopg.Connection
):
    (run_id,) = enqueue(owner, uuid.uuid4())
    # The holder's row is the run's next journal row, triggers off so nothing else of this
    # insert checks or waits; it commits while the claim waits on it.
    superuser.execute("SET LOCAL session_replication_role = replica")
    superuser.execute(
        "INSERT INTO runrow.run_event (run_id, seq, type, payload)"
        " SELECT %s, max(e.seq) + 1, 'blocker', '{}' FROM runrow.run_event AS e WHERE e.run_id = %s",
        (run_id, run_id),
    )

    claimer = Background(connect(), lambda conn: claim(conn, 10))
    claimer.wait_blocked_by(owner, superuser)
    superuser.commit()

    returned = claimer.result()
    assert run_row(owner, run_id)["status"] == "queued", "the claim was rolled back"
    assert returned == [], f"claim_runs returned runs it did not claim: {returned}"
    # Nothing was lost: the run stays claimable, and the next claim takes it.
    assert [r["run_id"] for r in claim(owner, 10)] == [run_id]


def test_finish_and_claim_whose_statement_fails_ends_the_runs_alone(
    owner: psycopg.Connection, connect: Connect, superuser: psycopg.Connection
):
    """finish_and_claim_runs ends a batch and claims the next in one statement. When that
    statement fails and is caught, the claim is dropped and the endings are written alone: a
    worker's finished runs must not stay running because another claimer collided."""
    (ending,) = enqueue(owner, uuid.uuid4())
    (held,) = claim(owner, 1)
    assert held["run_id"] == ending
    (queued,) = enqueue(owner, uuid.uuid4())
    superuser.execute("SET LOCAL session_replication_role = replica")
    superuser.execute(
        "INSERT INTO runrow.run_event (run_id, seq, type, payload)"
        " SELECT %s, max(e.seq) + 1, 'blocker', '{}' FROM runrow.run_event AS e WHERE e.run_id = %s",
        (queued, queued),
    )
    acks = json.dumps(
        [{"run_id": str(ending), "claim_token": str(held["claim_token"]), "status": "completed"}]
    )

    def finish_and_claim(conn: psycopg.Connection) -> list[tuple]:
        return conn.execute(
            "SELECT run_id, finished, last_seq IS NOT NULL, claim_token"
            " FROM runrow.finish_and_claim_runs(%s, 'w', 10)",
            (acks,),
        ).fetchall()

    caller = Background(connect(), finish_and_claim)
    caller.wait_blocked_by(owner, superuser)
    superuser.commit()

    assert caller.result() == [(ending, True, True, None)], "the ending alone, no claim"
    assert run_row(owner, ending)["status"] == "completed"
    assert [t for _, t in journal(owner, ending)][-2:] == ["run_claimed", "complete"]
    assert run_row(owner, queued)["status"] == "queued", "the claim was rolled back"
    assert (
        owner.execute("SELECT count(*) FROM runrow.audit() WHERE run_id = %s", (ending,)).fetchone()[0] == 0
    )
    assert [r["run_id"] for r in claim(owner, 10)] == [queued]
