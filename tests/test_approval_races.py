"""Races around a parked run, each forced into one interleaving: one session holds its
transaction open, the other call is made in a thread and observed blocked on it
(pg_blocking_pids), then the holder commits.

- two people decide the same call at once: the first decision stands, the second gets 55000
  naming it;
- a stop and an approval at once: whichever locks the run first wins, the other sees the
  result (a cancelled run is not requeued; an approved run that was requeued is then stopped
  while queued).
"""

from __future__ import annotations

import psycopg
import pytest
from race_support import Background, Connect, database_url, owner
from steps_support import begin, resolve, status, tool_turn
from tail_support import claim, enqueue

ARGS = {"instance": "i-123"}

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer


def _parked(conn: psycopg.Connection) -> tuple:
    run_id = enqueue(conn, "terminate it", tools=["terminate_instance"])
    token = claim(conn, run_id)
    key = tool_turn(conn, run_id, token, "tu_t", "terminate_instance", ARGS)
    assert begin(conn, run_id, token, key, "terminate_instance", ARGS, "irreversible")[0] == "needs_approval"
    return run_id, key


def test_two_decisions_at_once_the_first_stands(owner: psycopg.Connection, connect: Connect) -> None:
    observer, alice, bob = owner, connect(autocommit=False), connect()
    run_id, key = _parked(observer)
    assert resolve(alice, key, True, "alice") == run_id  # open transaction, holds the run row
    second = Background(bob, lambda c: resolve(c, key, False, "bob"))
    second.wait_blocked_by(observer, alice)
    alice.commit()
    with pytest.raises(
        psycopg.errors.ObjectNotInPrerequisiteState, match=r"it is approved \(decided by alice"
    ):
        second.result()
    row = observer.execute(
        "SELECT state, decided_by FROM runrow.tool_effect WHERE idempotency_key = %s", (key,)
    ).fetchone()
    assert row == ("approved", "alice")
    assert status(observer, run_id) == "queued"


def test_stop_first_then_approval_finds_nothing_to_decide(
    owner: psycopg.Connection, connect: Connect
) -> None:
    observer, stopper, approver = owner, connect(autocommit=False), connect()
    run_id, key = _parked(observer)
    assert stopper.execute("SELECT runrow.cancel_run(%s)", (run_id,)).fetchone()[0] == "cancelled"
    late = Background(approver, lambda c: resolve(c, key, True, "alice"))
    late.wait_blocked_by(observer, stopper)
    stopper.commit()
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=r"is cancelled, not waiting"):
        late.result()
    assert status(observer, run_id) == "cancelled"
    assert observer.execute(
        "SELECT state FROM runrow.tool_effect WHERE idempotency_key = %s", (key,)
    ).fetchone() == ("needs_approval",)


def test_approval_first_then_stop_cancels_the_requeued_run(
    owner: psycopg.Connection, connect: Connect
) -> None:
    observer, approver, stopper = owner, connect(autocommit=False), connect()
    run_id, key = _parked(observer)
    assert resolve(approver, key, True, "alice") == run_id
    stop = Background(stopper, lambda c: c.execute("SELECT runrow.cancel_run(%s)", (run_id,)).fetchone()[0])
    stop.wait_blocked_by(observer, approver)
    approver.commit()
    assert stop.result() == "cancelled"
    assert status(observer, run_id) == "cancelled"
    # Approved, never begun: nothing ran, and nothing ever will.
    assert observer.execute(
        "SELECT state FROM runrow.tool_effect WHERE idempotency_key = %s", (key,)
    ).fetchone() == ("approved",)
