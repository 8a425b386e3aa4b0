"""finish_runs wakes exactly who finish_run wakes: each finished run's tails (with the seq of
its last event) when a tail watches it, and the dispatchers once per conversation whose next
turn waited on it; a run fenced out wakes nobody. Notifications are only delivered on commit,
so this is checked with real LISTEN sessions.
"""

from __future__ import annotations

import uuid

import psycopg
from psycopg.types.json import Jsonb
from race_support import Connect, claim, database_url, enqueue, owner

from pyworker.db.batch import Ack, Finished, finish_runs

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer


def listener(
    connect: Connect, channels: list[str], watch: list[uuid.UUID] | None = None
) -> psycopg.Connection:
    """LISTEN, then watch the runs (a tail's order): their journal writes notify from now on."""
    conn = connect()
    for channel in channels:
        conn.execute(f"LISTEN {channel}")
    if watch:
        states = conn.execute("SELECT state FROM runrow.watch_runs(%s::uuid[])", (watch,)).fetchall()
        assert {s for (s,) in states} == {"watching"}
    return conn


def received(conn: psycopg.Connection) -> list[tuple[str, str]]:
    """Every notification delivered so far (the sender has committed)."""
    return [(n.channel, n.payload) for n in conn.notifies(timeout=0.5)]


def channel(conn: psycopg.Connection, run_id: uuid.UUID) -> str:
    return conn.execute("SELECT runrow.events_channel(%s)", (run_id,)).fetchone()[0]


def running(owner: psycopg.Connection, turns: int = 1) -> tuple[dict, uuid.UUID]:
    conversation = uuid.uuid4()
    enqueue(owner, conversation, turns)
    (run,) = claim(owner, 1)
    return run, conversation


EVENTS = [{"type": "text_delta", "text": "a"}, {"type": "text_delta", "text": "b"}]


def test_finish_runs_wakes_like_finish_run(owner: psycopg.Connection, connect: Connect):
    single, single_conv = running(owner, turns=2)
    batched, batched_conv = running(owner, turns=2)
    channels = ["runrow_enqueued", channel(owner, single["run_id"]), channel(owner, batched["run_id"])]
    listen = listener(connect, channels, watch=[single["run_id"], batched["run_id"]])

    # The single-run way: append_events + finish_run in one transaction.
    with owner.transaction():
        owner.execute(
            "SELECT runrow.append_events(%s, %s, %s)",
            (single["run_id"], single["claim_token"], Jsonb(EVENTS)),
        )
        owner.execute(
            "SELECT runrow.finish_run(%s, %s, 'completed')", (single["run_id"], single["claim_token"])
        )
    single_last = owner.execute(
        "SELECT max(seq) FROM runrow.run_event WHERE run_id = %s", (single["run_id"],)
    ).fetchone()[0]
    single_wakes = received(listen)

    (row,) = owner.execute(
        "SELECT finished, last_seq FROM runrow.finish_runs(%s)",
        (
            Jsonb(
                [
                    {
                        "run_id": str(batched["run_id"]),
                        "claim_token": str(batched["claim_token"]),
                        "status": "completed",
                        "events": EVENTS,
                    }
                ]
            ),
        ),
    ).fetchall()
    assert row[0] is True
    batched_wakes = received(listen)

    # The dispatchers: once, with the conversation (its next turn is claimable now).
    assert [w for w in single_wakes if w[0] == "runrow_enqueued"] == [("runrow_enqueued", str(single_conv))]
    assert [w for w in batched_wakes if w[0] == "runrow_enqueued"] == [("runrow_enqueued", str(batched_conv))]
    # The tails: woken with the seq of the run's last event. finish_run's transaction also
    # sends the append's own seq first; one batched call has only the final one to send.
    assert [w for w in single_wakes if w[0] != "runrow_enqueued"][-1] == (channels[1], str(single_last))
    assert [w for w in batched_wakes if w[0] != "runrow_enqueued"] == [(channels[2], str(row[1]))]


def test_finish_runs_wakes_only_waiters_and_not_the_fenced_out(owner: psycopg.Connection, connect: Connect):
    # Two runs with a turn queued behind them, one without; the first and last watched.
    runs = [running(owner, turns=2), running(owner, turns=1), running(owner, turns=2)]
    zombie, zombie_conv = running(owner, turns=2)
    watched = [runs[0][0]["run_id"], runs[2][0]["run_id"], zombie["run_id"]]
    channels = ["runrow_enqueued", *(channel(owner, r["run_id"]) for r, _ in [*runs, (zombie, zombie_conv)])]
    listen = listener(connect, channels, watch=watched)
    batch = [
        {"run_id": str(r["run_id"]), "claim_token": str(r["claim_token"]), "status": "completed"}
        for r, _ in runs
    ]
    batch.insert(
        1, {"run_id": str(zombie["run_id"]), "claim_token": str(uuid.uuid4()), "status": "completed"}
    )
    rows = owner.execute(
        "SELECT run_id, finished, last_seq FROM runrow.finish_runs(%s)", (Jsonb(batch),)
    ).fetchall()
    assert [finished for _, finished, _ in rows] == [True, False, True, True]

    wakes = received(listen)
    # The dispatchers: only the conversations whose next turn was waiting.
    assert sorted(p for c, p in wakes if c == "runrow_enqueued") == sorted([str(runs[0][1]), str(runs[2][1])])
    # The tails: only the watched runs that finished, each once with its last seq.
    assert sorted((c, p) for c, p in wakes if c != "runrow_enqueued") == sorted(
        (channel(owner, run_id), str(seq)) for run_id, finished, seq in rows if finished and run_id in watched
    )
    assert all(c != channels[-1] for c, _ in wakes), "the fenced-out run's tails were woken"
    # The ended runs' watches are gone; the fenced-out run's stays (it is still running).
    left = {
        r for (r,) in owner.execute("SELECT run_id FROM runrow.run_watch WHERE run_id = ANY (%s)", (watched,))
    }
    assert left == {zombie["run_id"]}


async def test_the_typed_wrapper_finishes_a_batch_and_reports_the_fenced_out(
    owner: psycopg.Connection, database_url: str
):
    run, _ = running(owner)
    zombie, _ = running(owner)
    acks = [
        Ack(run["run_id"], run["claim_token"], "completed", result={"text": "ab"}, events=EVENTS),
        Ack(zombie["run_id"], uuid.uuid4(), "failed", error="not mine"),
    ]
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        assert await finish_runs(conn, []) == []
        out = await finish_runs(conn, acks)
    last = owner.execute(
        "SELECT max(seq) FROM runrow.run_event WHERE run_id = %s", (run["run_id"],)
    ).fetchone()[0]
    assert out == [Finished(run["run_id"], True, last), Finished(zombie["run_id"], False, None)]
    assert [
        t
        for (t,) in owner.execute(
            "SELECT type FROM runrow.run_event WHERE run_id = %s ORDER BY seq DESC LIMIT 3", (run["run_id"],)
        ).fetchall()
    ] == ["complete", "text_delta", "text_delta"]
    assert owner.execute("SELECT status FROM runrow.agent_run WHERE id = %s", (zombie["run_id"],)).fetchone()[
        0
    ] == ("running")


def test_finish_and_claim_runs_wakes_only_the_watched_tails(owner: psycopg.Connection, connect: Connect):
    """The one-call lifecycle wakes the tails finish_runs would: a watched run's once, with its
    last seq; an unwatched run's not at all (its wake helper is skipped); the watch is dropped."""
    watched, _ = running(owner)
    unwatched, _ = running(owner)
    channels = [channel(owner, watched["run_id"]), channel(owner, unwatched["run_id"])]
    listen = listener(connect, channels, watch=[watched["run_id"]])
    batch = [
        {
            "run_id": str(r["run_id"]),
            "claim_token": str(r["claim_token"]),
            "status": "completed",
            "events": EVENTS,
        }
        for r in (watched, unwatched)
    ]
    rows = owner.execute(
        "SELECT run_id, finished, last_seq FROM runrow.finish_and_claim_runs(%s, 'wake-probe', 1, 30)"
        " WHERE finished IS NOT NULL",
        (Jsonb(batch),),
    ).fetchall()
    assert [finished for _, finished, _ in rows] == [True, True]
    assert received(listen) == [(channels[0], str(rows[0][2]))]
    left = owner.execute(
        "SELECT count(*) FROM runrow.run_watch WHERE run_id = %s", (watched["run_id"],)
    ).fetchone()
    assert left == (0,)
