"""Wakes only for waiters (migration 0025), with real LISTEN sessions and real row locks.

A run's journal channel is notified only while a tail watches it (runrow.watch_runs); a watch
is registered under the run's row lock, so a writer in flight makes it come back busy rather
than be missed; the hub registers, retries and re-arms on its own. A lifecycle nobody waits on
notifies nobody: the per-run cost of a LISTENing fleet does not grow with its size.
"""

from __future__ import annotations

import asyncio
import uuid

import psycopg
from psycopg.types.json import Jsonb
from race_support import Connect, claim_one, database_url, enqueue, owner

from pyworker.db import channels
from pyworker.db.hub import RECONNECT_WAKE, Hub

__all__ = ["database_url", "owner"]


def received(conn: psycopg.Connection, within: float = 0.5) -> list[tuple[str, str]]:
    return [(n.channel, n.payload) for n in conn.notifies(timeout=within)]


def watch(conn: psycopg.Connection, *runs: uuid.UUID) -> dict[uuid.UUID, str]:
    return dict(
        conn.execute("SELECT run_id, state FROM runrow.watch_runs(%s::uuid[])", (list(runs),)).fetchall()
    )


def lifecycle(conn: psycopg.Connection, run: dict) -> None:
    with conn.transaction():
        conn.execute(
            "SELECT runrow.append_events(%s, %s, %s)",
            (run["run_id"], run["claim_token"], Jsonb([{"type": "text_delta", "text": "x"}])),
        )
        conn.execute("SELECT runrow.finish_run(%s, %s, 'completed')", (run["run_id"], run["claim_token"]))


def test_a_lifecycle_nobody_waits_on_notifies_nobody(owner: psycopg.Connection, connect: Connect) -> None:
    enqueue(owner, uuid.uuid4())
    run = claim_one(owner)
    listen = connect()
    listen.execute("LISTEN runrow_enqueued")
    listen.execute(f"LISTEN {channels.events_channel(run['run_id'])}")
    lifecycle(owner, run)
    assert received(listen) == []


def test_a_watched_run_notifies_its_tail_and_its_ending_drops_the_watch(
    owner: psycopg.Connection, connect: Connect
) -> None:
    enqueue(owner, uuid.uuid4())
    run = claim_one(owner)
    channel = channels.events_channel(run["run_id"])
    listen = connect()
    listen.execute(f"LISTEN {channel}")
    assert watch(listen, run["run_id"]) == {run["run_id"]: "watching"}
    lifecycle(owner, run)
    wakes = received(listen)
    assert wakes and {c for c, _ in wakes} == {channel}
    last = owner.execute(
        "SELECT max(seq) FROM runrow.run_event WHERE run_id = %s", (run["run_id"],)
    ).fetchone()[0]
    assert wakes[-1] == (channel, str(last))
    assert (
        owner.execute("SELECT count(*) FROM runrow.run_watch WHERE run_id = %s", (run["run_id"],)).fetchone()[
            0
        ]
        == 0
    )


def test_a_watch_under_a_writers_lock_is_busy_not_missed(owner: psycopg.Connection, connect: Connect) -> None:
    """The interleaving the lock exists for: a writer holds the run (its append not committed)
    when the tail registers. Registered without the lock, the writer (which checked for watches
    before the registration committed) would commit unannounced after the tail's read."""
    enqueue(owner, uuid.uuid4())
    run = claim_one(owner)
    channel = channels.events_channel(run["run_id"])
    writer = connect(autocommit=False)
    writer.execute(
        "SELECT runrow.append_events(%s, %s, %s)",
        (run["run_id"], run["claim_token"], Jsonb([{"type": "text_delta", "text": "in flight"}])),
    )
    tail = connect()
    tail.execute(f"LISTEN {channel}")
    assert watch(tail, run["run_id"]) == {run["run_id"]: "busy"}, "a watch must not pass a writer in flight"
    confirmed = owner.execute(
        "SELECT confirmed FROM runrow.run_watch WHERE run_id = %s", (run["run_id"],)
    ).fetchone()
    assert confirmed == (False,)
    writer.commit()
    assert watch(tail, run["run_id"]) == {run["run_id"]: "watching"}
    # From here on every write notifies.
    with owner.transaction():
        owner.execute(
            "SELECT runrow.append_events(%s, %s, %s)",
            (run["run_id"], run["claim_token"], Jsonb([{"type": "text_delta", "text": "after"}])),
        )
    assert [c for c, _ in received(tail)] == [channel]


def test_a_writer_behind_a_registration_sees_the_watch(owner: psycopg.Connection, connect: Connect) -> None:
    """The other order: the registration holds the run's row lock when the writer comes; the
    writer waits for it and then sees the watch (its check is a statement after its lock)."""
    enqueue(owner, uuid.uuid4())
    run = claim_one(owner)
    channel = channels.events_channel(run["run_id"])
    tail = connect(autocommit=False)
    tail.execute(f"LISTEN {channel}")
    assert watch(tail, run["run_id"]) == {run["run_id"]: "watching"}  # not committed: holds FOR SHARE
    writer = connect()
    done = writer.cursor()

    async def append_then_commit_tail() -> None:
        task = asyncio.create_task(
            asyncio.to_thread(
                done.execute,
                "SELECT runrow.append_events(%s, %s, %s)",
                (run["run_id"], run["claim_token"], Jsonb([{"type": "text_delta", "text": "x"}])),
            )
        )
        await asyncio.sleep(0.5)
        assert not task.done(), "the writer must wait for the registration's lock"
        tail.commit()
        await asyncio.wait_for(task, 10)

    asyncio.run(append_then_commit_tail())
    assert [c for c, _ in received(tail)] == [channel]


def test_a_repeatable_read_writer_notifies_regardless(owner: psycopg.Connection, connect: Connect) -> None:
    """Its snapshot may predate a watch committed before its lock: it cannot tell, so it wakes."""
    enqueue(owner, uuid.uuid4())
    run = claim_one(owner)
    channel = channels.events_channel(run["run_id"])
    listen = connect()
    listen.execute(f"LISTEN {channel}")
    writer = connect(autocommit=False)
    writer.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    writer.execute(
        "SELECT runrow.append_events(%s, %s, %s)",
        (run["run_id"], run["claim_token"], Jsonb([{"type": "text_delta", "text": "x"}])),
    )
    writer.commit()
    assert [c for c, _ in received(listen)] == [channel]


async def test_the_hub_retries_a_busy_watch_and_wakes_the_polling_tail(
    owner: psycopg.Connection, connect: Connect, database_url: str
) -> None:
    enqueue(owner, uuid.uuid4())
    run = claim_one(owner)
    channel = channels.events_channel(run["run_id"])
    writer = connect(autocommit=False)
    writer.execute(
        "SELECT runrow.append_events(%s, %s, %s)",
        (run["run_id"], run["claim_token"], Jsonb([{"type": "text_delta", "text": "in flight"}])),
    )
    hub = Hub(database_url)
    await hub.start()
    try:
        assert await hub.wait_connected(5)
        async with hub.subscribe(channel) as queue:
            assert hub.connected and not hub.armed(channel), "busy: the tail must poll, not trust a wait"
            await asyncio.sleep(0.5)  # several retries, all busy while the writer holds the run
            assert not hub.armed(channel)
            writer.commit()
            assert await asyncio.wait_for(queue.get(), 5) == RECONNECT_WAKE, "armed: re-read what was missed"
            assert hub.armed(channel)
            with owner.transaction():
                owner.execute(
                    "SELECT runrow.append_events(%s, %s, %s)",
                    (run["run_id"], run["claim_token"], Jsonb([{"type": "text_delta", "text": "y"}])),
                )
            payload = await asyncio.wait_for(queue.get(), 5)
            assert payload.isdigit()
    finally:
        await hub.stop()


def impatient(connect: Connect) -> psycopg.Connection:
    """A tail whose every lock wait of 100 ms is an error (55P03): a watch_runs that waited on a
    lock raises here instead of returning, whatever the timing."""
    conn = connect()
    conn.execute("SET lock_timeout = '100ms'")
    return conn


def watch_row(conn: psycopg.Connection, run_id: uuid.UUID) -> tuple | None:
    return conn.execute(
        "SELECT confirmed, expires_at > now() FROM runrow.run_watch WHERE run_id = %s", (run_id,)
    ).fetchone()


def watched_run_ending(
    owner: psycopg.Connection, connect: Connect
) -> tuple[uuid.UUID, psycopg.Connection, psycopg.Connection]:
    """A running run an impatient tail watches (confirmed), and a finish_run of it in flight: the
    run's id, the tail, and the ending's open transaction."""
    enqueue(owner, uuid.uuid4())
    run = claim_one(owner)
    tail = impatient(connect)
    assert watch(tail, run["run_id"]) == {run["run_id"]: "watching"}
    ending = connect(autocommit=False)
    ending.execute("SELECT runrow.finish_run(%s, %s, 'completed')", (run["run_id"], run["claim_token"]))
    return run["run_id"], tail, ending


def test_a_watch_never_waits_on_an_ending_in_flight(owner: psycopg.Connection, connect: Connect) -> None:
    """The ending drops the run's watch (_wake_tails_ended) and holds that row until it commits:
    a refresh of the confirmed watch used to wait for it (2.6 s behind a finish_run held 3 s: the
    SQL audit), and with it every other watch of the hub's call. Busy instead, not ended (the
    ending may still roll back), and ended once it committed."""
    run_id, tail, ending = watched_run_ending(owner, connect)
    enqueue(owner, uuid.uuid4())
    other = claim_one(owner)
    assert watch(tail, run_id, other["run_id"]) == {run_id: "busy", other["run_id"]: "watching"}
    ending.commit()
    assert watch(tail, run_id) == {run_id: "ended"}


def test_an_ending_rolled_back_keeps_the_watch(owner: psycopg.Connection, connect: Connect) -> None:
    """Busy while the ending holds the watch; it rolls back: the watch is still there, and the
    next call confirms it again (the hub asks again after WATCH_RETRY)."""
    run_id, tail, ending = watched_run_ending(owner, connect)
    assert watch(tail, run_id) == {run_id: "busy"}
    ending.rollback()
    assert watch_row(owner, run_id) == (True, True)
    assert watch(tail, run_id) == {run_id: "watching"}


def test_a_queued_run_cancelled_in_flight_is_busy_not_waited_for(
    owner: psycopg.Connection, connect: Connect
) -> None:
    """A queued run's watch is registered without the run's lock; a cancel in flight holds (and
    drops) the watch: busy, then ended."""
    (run_id,) = enqueue(owner, uuid.uuid4())
    tail = impatient(connect)
    assert watch(tail, run_id) == {run_id: "queued"}
    cancel = connect(autocommit=False)
    assert cancel.execute("SELECT runrow.cancel_run(%s)", (run_id,)).fetchone() == ("cancelled",)
    assert watch(tail, run_id) == {run_id: "busy"}
    cancel.commit()
    assert watch(tail, run_id) == {run_id: "ended"}


def test_a_registration_in_flight_elsewhere_is_busy_not_waited_for(
    owner: psycopg.Connection, connect: Connect
) -> None:
    """Another tail registered the run in a transaction still open: its new row is not ours to
    see yet, and an insert of our own would wait for its commit."""
    enqueue(owner, uuid.uuid4())
    run = claim_one(owner)
    first = connect(autocommit=False)
    assert watch(first, run["run_id"]) == {run["run_id"]: "watching"}
    tail = impatient(connect)
    assert watch(tail, run["run_id"]) == {run["run_id"]: "busy"}
    first.commit()
    assert watch(tail, run["run_id"]) == {run["run_id"]: "watching"}
