"""A batch ending whose run is being written by someone else at the same moment.

A worker's heartbeat for a run and the flush that ends it come from two connections of the
same pool, so a heartbeat committing while the ending's statement runs is the ordinary case,
not a corner. PostgreSQL then rechecks the run's newer row version (EvalPlanQual), and the
ending must land on it: the token still matches. finish_and_claim_runs once joined its
endings and its claims as a UNION ALL of two scans; through that append the recheck never
qualified, so the run came back fenced out (finished = false), stayed running, and was
reaped when its lease ran out, its worker's last events and outcome lost (a CI run of
tests/test_db_restart.py met it).

Forced into one interleaving: the heartbeat holds the row lock in an open transaction, the
batch call blocks on it (pg_blocking_pids), the heartbeat commits. The database first gets a
few hundred finished runs: on a handful of rows the planner hashes the whole key index, and
only the join by key that every real queue gets showed the loss.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb
from race_support import Background, Connect, claim, database_url, enqueue, journal, owner, run_row
from stats_support import flushed, index_scans

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer

BACKLOG = 300  # finished runs: the planner then joins the batch to agent_run by its key
ENDINGS = 4
PKEY = "runrow.agent_run_pkey"


@pytest.fixture(scope="module", autouse=True)
def finished_backlog(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for conversation in range(BACKLOG):
            enqueue(conn, uuid.UUID(int=conversation + 1))
        held = claim(conn, BACKLOG)
        ended = conn.execute("SELECT count(*) FROM runrow.finish_runs(%s) WHERE finished", (endings(held),))
        assert ended.fetchone()[0] == BACKLOG


def endings(runs: list[dict]) -> Jsonb:
    return Jsonb(
        [
            {
                "run_id": str(run["run_id"]),
                "claim_token": str(run["claim_token"]),
                "status": "completed",
                "events": [{"type": "text", "text": f"last words of {run['run_id']}"}],
            }
            for run in runs
        ]
    )


def end_all(conn: psycopg.Connection, call: str, runs: list[dict]) -> list[tuple]:
    """The batch call; (run_id, finished) per ending and the runs it claimed."""
    if call == "finish_runs":
        rows = conn.execute("SELECT run_id, finished FROM runrow.finish_runs(%s)", (endings(runs),))
        return rows.fetchall()
    rows = conn.execute(
        "SELECT run_id, finished FROM runrow.finish_and_claim_runs(%s, 'race-test', %s, 30)",
        (endings(runs), ENDINGS),
    )
    return rows.fetchall()


@pytest.mark.parametrize("beaten", [0, 1, ENDINGS - 1])
@pytest.mark.parametrize("call", ["finish_runs", "finish_and_claim_runs"])
def test_a_batch_ending_waiting_on_a_heartbeat_ends_the_run(
    owner: psycopg.Connection, connect: Connect, call: str, beaten: int
) -> None:
    for _ in range(ENDINGS):
        enqueue(owner, uuid.uuid4())
    held = claim(owner, ENDINGS)
    successors = [run_id for _ in range(ENDINGS) for run_id in enqueue(owner, uuid.uuid4())]
    run = held[beaten]
    beater = connect(autocommit=False)
    owned = beater.execute(
        "SELECT owned FROM runrow.heartbeat(%s, %s, 30)", (run["run_id"], run["claim_token"])
    ).fetchone()
    assert owned == (True,)

    flushed(owner)
    before = index_scans(owner, PKEY)
    ender = Background(connect(), lambda conn: end_all(conn, call, held))
    ender.wait_blocked_by(owner, beater)
    beater.commit()
    rows = ender.result()
    flushed(beater)
    flushed(ender.conn)
    # The control that the call joined its rows to agent_run by key, one probe per ending (and
    # per claimed run), the plan that lost the ending: over a hashed key index (one scan) the
    # old finish_and_claim_runs passed this test with the bug in it.
    probes = index_scans(owner, PKEY) - before
    assert probes >= ENDINGS * (2 if call == "finish_and_claim_runs" else 1), probes

    verdicts = [(run_id, finished) for run_id, finished in rows if finished is not None]
    assert verdicts == [(r["run_id"], True) for r in held]
    for r in held:
        assert run_row(owner, r["run_id"])["status"] == "completed"
        kinds = [kind for _, kind in journal(owner, r["run_id"])]
        assert kinds[-2:] == ["text", "complete"], (r["run_id"], kinds)
    if call == "finish_and_claim_runs":
        claimed = sorted(run_id for run_id, finished in rows if finished is None)
        assert claimed == sorted(successors)
