"""append_runs_events wakes exactly who append_events wakes: each written run's tails, once, with
the run's last seq, when a tail watches it; an unwatched run and a fenced-out one wake nobody,
and no dispatcher is woken (the runs keep running). Notifications are only delivered on commit,
so this is checked with real LISTEN sessions. The typed wrapper reports the fenced-out as None.
"""

from __future__ import annotations

import uuid

import psycopg
from psycopg.types.json import Jsonb
from race_support import Connect, claim, database_url, enqueue, owner
from test_finish_runs import channel, listener, received

from pyworker.db.batch import Appends, append_runs_events

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer

EVENTS = [{"type": "text_delta", "index": 0, "text": "a"}, {"type": "text_delta", "index": 0, "text": "b"}]


def running(owner: psycopg.Connection) -> dict:
    enqueue(owner, uuid.uuid4())
    (run,) = claim(owner, 1)
    return run


def element(run: dict, token: uuid.UUID | None = None) -> dict:
    return {"run_id": str(run["run_id"]), "claim_token": str(token or run["claim_token"]), "events": EVENTS}


def test_appends_wake_only_the_watched_and_written(owner: psycopg.Connection, connect: Connect) -> None:
    watched, unwatched, zombie = running(owner), running(owner), running(owner)
    single = running(owner)
    tails = [channel(owner, r["run_id"]) for r in (watched, unwatched, zombie, single)]
    listen = listener(
        connect, ["runrow_enqueued", *tails], watch=[watched["run_id"], zombie["run_id"], single["run_id"]]
    )

    rows = owner.execute(
        "SELECT run_id, last_seq FROM runrow.append_runs_events(%s)",
        (Jsonb([element(watched), element(zombie, uuid.uuid4()), element(unwatched)]),),
    ).fetchall()
    assert [(r, seq is not None) for r, seq in rows] == [
        (watched["run_id"], True),
        (zombie["run_id"], False),
        (unwatched["run_id"], True),
    ]
    batched = received(listen)
    # The single-run way, for comparison: append_events of the same events.
    (single_seq,) = owner.execute(
        "SELECT runrow.append_events(%s, %s, %s)", (single["run_id"], single["claim_token"], Jsonb(EVENTS))
    ).fetchone()
    singles = received(listen)

    assert batched == [(tails[0], str(rows[0][1]))], (
        "only the watched run that was written, once, with its last seq"
    )
    assert singles == [(tails[3], str(single_seq))], "append_events wakes the same way"
    watching = owner.execute(
        "SELECT run_id FROM runrow.run_watch WHERE run_id = ANY (%s)",
        ([watched["run_id"], zombie["run_id"]],),
    ).fetchall()
    assert {r for (r,) in watching} == {watched["run_id"], zombie["run_id"]}, "appends drop no watch"


async def test_the_typed_wrapper_appends_a_batch_and_reports_the_fenced_out(
    owner: psycopg.Connection, database_url: str
) -> None:
    run, zombie = running(owner), running(owner)
    before = owner.execute(
        "SELECT count(*) FROM runrow.run_event WHERE run_id = %s", (run["run_id"],)
    ).fetchone()[0]
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        seqs = await append_runs_events(
            conn,
            [
                Appends(run["run_id"], run["claim_token"], EVENTS),
                Appends(zombie["run_id"], uuid.uuid4(), EVENTS),
            ],
        )
        assert await append_runs_events(conn, []) == []
    assert seqs == [before + 2, None]
    texts = owner.execute(
        "SELECT payload ->> 'text' FROM runrow.run_event"
        " WHERE run_id = %s AND type = 'text_delta' ORDER BY seq",
        (run["run_id"],),
    ).fetchall()
    assert [t for (t,) in texts] == ["a", "b"]
