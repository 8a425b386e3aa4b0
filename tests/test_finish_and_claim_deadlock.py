"""Two batch calls that each end a turn and find the other's next turn blocked.

finish_and_claim_runs walks the queue before it writes its endings: a queued turn found behind
a running one is locked and marked claim_blocked, and the call's ending of a run then locks that
run's next turn (agent_run_after_update) to clear its mark. Call A marks the next turn of
conversation 2 and ends the running turn of conversation 1; call B marks the next turn of
conversation 1 and ends the running turn of conversation 2: each ending waits for the other's
mark, a deadlock. `make test` met it once in tests/test_races.py's stress of four processes on
five conversations, whose loser had no retry: its run stayed running and the test hung.

The call resolves it itself: the loser's block (its walk, marks, claims and endings) rolls
back, and its endings are written alone, as after any collision of its claim, so both calls
end their runs and neither caller sees 40P01. Forced into that interleaving with real
connections: a holder keeps both running turns share-locked (each call blocks on it once its
walk is done), another keeps conversation 1's next turn locked while A walks (so A marks only
conversation 2's).
"""

from __future__ import annotations

import uuid

import psycopg
from psycopg.types.json import Jsonb
from race_support import Background, Connect, claim, database_url, enqueue, journal, owner, run_row

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer


def end_and_claim(conn: psycopg.Connection, run: dict, worker_id: str) -> list[tuple]:
    ending = {"run_id": str(run["run_id"]), "claim_token": str(run["claim_token"]), "status": "completed"}
    rows = conn.execute(
        "SELECT run_id, finished FROM runrow.finish_and_claim_runs(%s, %s, 1, 30)",
        (Jsonb([ending]), worker_id),
    )
    return rows.fetchall()


def test_two_calls_that_each_mark_the_others_next_turn_both_end_their_runs(
    owner: psycopg.Connection, connect: Connect
) -> None:
    first, second = uuid.uuid4(), uuid.uuid4()
    enqueue(owner, first)
    enqueue(owner, second)
    held = {run["conversation_id"]: run for run in claim(owner, 2)}
    # Queued once their turns ahead run, so no claim has marked them yet.
    (next_first,) = enqueue(owner, first)
    (next_second,) = enqueue(owner, second)

    holder = connect(autocommit=False)
    holder.execute(
        "SELECT 1 FROM runrow.agent_run WHERE id = ANY (%s) FOR SHARE",
        ([held[first]["run_id"], held[second]["run_id"]],),
    )
    hider = connect(autocommit=False)
    hider.execute("SELECT 1 FROM runrow.agent_run WHERE id = %s FOR UPDATE", (next_first,))

    # A walks past conversation 1's next turn (locked: skipped), marks conversation 2's, and
    # waits on the holder to end conversation 1's running turn.
    a = Background(connect(), lambda conn: end_and_claim(conn, held[first], "race-a"))
    a.wait_blocked_by(owner, holder)
    assert run_row(owner, next_second)["claim_blocked"] is False  # A's mark is not committed
    hider.commit()
    # B marks conversation 1's next turn (conversation 2's is A's: skipped) and waits likewise.
    b = Background(connect(), lambda conn: end_and_claim(conn, held[second], "race-b"))
    b.wait_blocked_by(owner, holder)
    holder.commit()

    # Before the fix one of them raised 40P01 here, and its run stayed running.
    rows = {"a": a.result(), "b": b.result()}
    assert [row for row in rows["a"] if row[1] is not None] == [(held[first]["run_id"], True)]
    assert [row for row in rows["b"] if row[1] is not None] == [(held[second]["run_id"], True)]
    for run in held.values():
        assert run_row(owner, run["run_id"])["status"] == "completed"
        assert journal(owner, run["run_id"])[-1][1] == "complete"
    # The winner may have claimed a next turn once the loser's ending was in (its slot was
    # free); neither next turn is left marked behind a turn that has ended: the next claim
    # takes the rest, and no turn is taken twice.
    taken = [run_id for call in rows.values() for run_id, finished in call if finished is None]
    taken += [r["run_id"] for r in claim(owner, 2)]
    assert sorted(taken) == sorted([next_first, next_second])
