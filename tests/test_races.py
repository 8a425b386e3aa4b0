"""Races between real sessions, each forced into one deterministic interleaving.

Pattern: session 1 makes its call inside an open transaction (it now holds the run's row
lock), session 2 makes the competing call in a thread, the test waits until the server
reports session 2 blocked on session 1 (pg_blocking_pids), then session 1 commits and the
test checks what session 2 did. Then the same with the roles swapped. A claim and a reaper
never wait (SKIP LOCKED): there the test checks that it returns at once, with what, while
session 1 still holds its transaction open, and what the next call does after the commit.

The module works in a database of its own, and every test starts with no active run, so
a claim can only return what the test enqueued.
"""

from __future__ import annotations

import itertools
import multiprocessing
import time
import uuid
from collections.abc import Callable

import psycopg
import pytest
from psycopg.types.json import Jsonb
from race_support import (
    Background,
    Connect,
    begin_irreversible,
    claim,
    claim_one,
    database_url,
    enqueue,
    expire_lease,
    journal,
    owner,
    run_row,
    stress_one_call_worker,
    stress_worker,
    tool_turn,
)

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer


def reap(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute("SELECT run_id, outcome FROM runrow.reap_expired_runs(grace_seconds => 0)").fetchall()


def heartbeat(conn: psycopg.Connection, run: dict) -> tuple[bool, bool]:
    return conn.execute(
        "SELECT owned, cancel_requested FROM runrow.heartbeat(%s, %s, 30)",
        (run["run_id"], run["claim_token"]),
    ).fetchone()


def finish(conn: psycopg.Connection, run: dict, status: str = "completed") -> bool:
    return conn.execute(
        "SELECT runrow.finish_run(%s, %s, %s)", (run["run_id"], run["claim_token"], status)
    ).fetchone()[0]


def append(conn: psycopg.Connection, run: dict, count: int = 2) -> int | None:
    events = Jsonb([{"type": "text", "text": f"part {n}"} for n in range(count)])
    return conn.execute(
        "SELECT runrow.append_events(%s, %s, %s)", (run["run_id"], run["claim_token"], events)
    ).fetchone()[0]


def stop(conn: psycopg.Connection, conversation_id: uuid.UUID) -> list[tuple]:
    return conn.execute(
        "SELECT run_id, action FROM runrow.stop_conversation(%s)", (conversation_id,)
    ).fetchall()


def assert_gap_free(events: list[tuple[int, str]]) -> None:
    assert [seq for seq, _ in events] == list(range(1, len(events) + 1)), events


def claimed_running(owner: psycopg.Connection, max_attempts: int = 1) -> dict:
    conversation = uuid.uuid4()
    (run_id,) = enqueue(owner, conversation, max_attempts=max_attempts)
    run = claim_one(owner)
    assert run["run_id"] == run_id
    return run


# --- a. heartbeat vs reaper -----------------------------------------------------------


def test_reaper_skips_a_run_whose_heartbeat_is_in_flight_and_the_heartbeat_keeps_it(
    owner: psycopg.Connection, connect: Connect
):
    run = claimed_running(owner)
    expire_lease(owner, run["run_id"])
    worker = connect(autocommit=False)
    assert heartbeat(worker, run) == (True, False)  # holds the row lock; lease now in the future

    # The reaper does not wait on the row: it leaves it for its next pass and returns.
    assert Background(connect(), reap).result() == []
    worker.commit()

    assert reap(owner) == []  # the next pass sees the heartbeat
    row = run_row(owner, run["run_id"])
    assert (row["status"], row["claim_token"]) == ("running", run["claim_token"])
    assert heartbeat(owner, run) == (True, False)
    assert [t for _, t in journal(owner, run["run_id"])] == [
        "user_message_created",
        "run_queued",
        "run_claimed",
    ]


def test_reap_committing_while_the_heartbeat_waits_fences_the_worker_out(
    owner: psycopg.Connection, connect: Connect
):
    run = claimed_running(owner)
    expire_lease(owner, run["run_id"])
    reaper = connect(autocommit=False)
    assert reap(reaper) == [(run["run_id"], "failed")]

    worker = Background(connect(), lambda conn: heartbeat(conn, run))
    worker.wait_blocked_by(owner, reaper)
    reaper.commit()

    assert worker.result() == (False, False)
    assert run_row(owner, run["run_id"])["status"] == "failed"


# --- b. finish vs reap ----------------------------------------------------------------


def test_reaper_skips_a_finishing_run_and_its_next_pass_is_a_no_op(
    owner: psycopg.Connection, connect: Connect
):
    run = claimed_running(owner)
    expire_lease(owner, run["run_id"])
    worker = connect(autocommit=False)
    assert finish(worker, run) is True

    assert Background(connect(), reap).result() == []  # skipped, not waited on
    worker.commit()

    assert reap(owner) == []
    assert run_row(owner, run["run_id"])["status"] == "completed"
    events = journal(owner, run["run_id"])
    assert_gap_free(events)
    assert [t for _, t in events].count("complete") == 1


@pytest.mark.parametrize(("max_attempts", "outcome", "completes"), [(1, "failed", 1), (2, "queued", 0)])
def test_reap_first_then_the_waiting_finish_is_fenced_out(
    owner: psycopg.Connection, connect: Connect, max_attempts: int, outcome: str, completes: int
):
    run = claimed_running(owner, max_attempts=max_attempts)
    expire_lease(owner, run["run_id"])
    reaper = connect(autocommit=False)
    assert reap(reaper) == [(run["run_id"], "requeued" if outcome == "queued" else outcome)]

    worker = Background(connect(), lambda conn: finish(conn, run))
    worker.wait_blocked_by(owner, reaper)
    reaper.commit()

    assert worker.result() is False
    assert run_row(owner, run["run_id"])["status"] == outcome
    events = journal(owner, run["run_id"])
    assert_gap_free(events)
    assert [t for _, t in events].count("complete") == completes


def test_two_reapers_reap_a_run_once(owner: psycopg.Connection, connect: Connect):
    run = claimed_running(owner, max_attempts=2)
    expire_lease(owner, run["run_id"])
    first = connect(autocommit=False)
    assert reap(first) == [(run["run_id"], "requeued")]

    # The second reaper skips the row the first one holds, at once.
    assert Background(connect(), reap).result() == []
    first.commit()

    assert reap(owner) == []
    row = run_row(owner, run["run_id"])
    assert (row["status"], row["attempt"]) == ("queued", 1)
    assert [t for _, t in journal(owner, run["run_id"])].count("run_requeued") == 1


def test_a_key_share_lock_on_a_run_does_not_hold_up_its_reap(owner: psycopg.Connection, connect: Connect):
    """A fork_run of the running run (its foreign key takes FOR KEY SHARE) or any other key-share
    holder does not conflict with the reap's own lock (FOR NO KEY UPDATE): the reaper promises it
    never waits on a row lock. 7fb3700's FOR UPDATE in _end_claim waited until the holder ended."""
    run = claimed_running(owner, max_attempts=1)
    expire_lease(owner, run["run_id"])
    holder = connect(autocommit=False)
    holder.execute("SELECT 1 FROM runrow.agent_run WHERE id = %s FOR KEY SHARE", (run["run_id"],))
    reaper = connect()
    reaper.execute("SET lock_timeout = '200ms'")  # a wait is an error here (55P03), not a timing
    assert reap(reaper) == [(run["run_id"], "failed")]
    holder.rollback()


def test_reap_after_an_uncommitted_stop_ends_the_run_cancelled(owner: psycopg.Connection, connect: Connect):
    run = claimed_running(owner, max_attempts=3)
    expire_lease(owner, run["run_id"])
    stopper = connect(autocommit=False)
    assert stop(stopper, run["conversation_id"]) == [(run["run_id"], "cancel_requested")]

    assert Background(connect(), reap).result() == []  # the stop holds the row: next pass
    stopper.commit()

    # Attempts are left, but the stop wins: the orphan is not requeued to start again.
    assert reap(owner) == [(run["run_id"], "cancelled")]
    events = journal(owner, run["run_id"])
    assert_gap_free(events)
    assert [t for _, t in events][-2:] == ["cancel_requested", "complete"]
    assert claim(owner, 10) == []


# --- c. append vs reap ----------------------------------------------------------------


def test_append_first_lands_before_the_next_passs_complete(owner: psycopg.Connection, connect: Connect):
    run = claimed_running(owner)
    expire_lease(owner, run["run_id"])
    worker = connect(autocommit=False)
    assert append(worker, run, 2) == 5

    assert Background(connect(), reap).result() == []  # the flush holds the row: next pass
    worker.commit()

    # An append does not extend the lease, so the next pass reaps it, after the events.
    assert reap(owner) == [(run["run_id"], "failed")]
    events = journal(owner, run["run_id"])
    assert_gap_free(events)
    assert [t for _, t in events][3:] == ["text", "text", "complete"]


def test_reap_first_then_the_waiting_append_writes_nothing(owner: psycopg.Connection, connect: Connect):
    run = claimed_running(owner)
    expire_lease(owner, run["run_id"])
    reaper = connect(autocommit=False)
    assert reap(reaper) == [(run["run_id"], "failed")]

    worker = Background(connect(), lambda conn: append(conn, run, 2))
    worker.wait_blocked_by(owner, reaper)
    reaper.commit()

    assert worker.result() is None
    events = journal(owner, run["run_id"])
    assert_gap_free(events)
    assert [t for _, t in events][-1] == "complete"
    assert "text" not in [t for _, t in events]


def append_runs(conn: psycopg.Connection, runs: list[dict]) -> list[int | None]:
    batch = [
        {"run_id": str(r["run_id"]), "claim_token": str(r["claim_token"]), "events": [{"type": "text"}]}
        for r in runs
    ]
    rows = conn.execute("SELECT last_seq FROM runrow.append_runs_events(%s)", (Jsonb(batch),)).fetchall()
    return [seq for (seq,) in rows]


def test_reap_first_then_the_waiting_batch_append_writes_only_the_others(
    owner: psycopg.Connection, connect: Connect
):
    """append_runs_events waits on the reaper's uncommitted lock of one of its runs, and
    rechecks that run's token on the row the reaper committed: fenced out there, written for
    the run nobody took."""
    reaped, kept = claimed_running(owner), claimed_running(owner)
    expire_lease(owner, reaped["run_id"])
    reaper = connect(autocommit=False)
    assert reap(reaper) == [(reaped["run_id"], "failed")]

    worker = Background(connect(), lambda conn: append_runs(conn, [kept, reaped]))
    worker.wait_blocked_by(owner, reaper)
    reaper.commit()

    assert worker.result() == [4, None]
    assert "text" not in [t for _, t in journal(owner, reaped["run_id"])]
    events = journal(owner, kept["run_id"])
    assert_gap_free(events)
    assert [t for _, t in events][-1] == "text"


# --- d, e. claimers and turn order ----------------------------------------------------


def test_second_claimer_takes_nothing_while_the_first_holds_turn_one(
    owner: psycopg.Connection, connect: Connect
):
    conversation = uuid.uuid4()
    turn1, turn2 = enqueue(owner, conversation, 2)
    claimer_a = connect(autocommit=False)
    assert [r["run_id"] for r in claim(claimer_a)] == [turn1]

    # Turn 1 is locked (skipped) and still queued in B's snapshot, so turn 2 is not the
    # oldest queued turn: B returns nothing at once, without waiting and without an error.
    claimer_b = Background(connect(), lambda conn: claim(conn, 10))
    assert claimer_b.result() == []
    claimer_a.commit()

    # Turn 1 running: turn 2 still waits behind it, then starts once turn 1 ends.
    assert claim(owner, 10) == []
    assert run_row(owner, turn2)["status"] == "queued"
    assert finish(owner, {"run_id": turn1, "claim_token": run_row(owner, turn1)["claim_token"]})
    assert [r["run_id"] for r in claim(owner, 10)] == [turn2]


def test_one_claim_call_takes_only_the_oldest_turn_of_a_conversation(owner: psycopg.Connection):
    conversation = uuid.uuid4()
    turn1, _turn2, _turn3 = enqueue(owner, conversation, 3)
    assert [r["run_id"] for r in claim(owner, 10)] == [turn1]


def test_claimer_skipping_a_locked_first_turn_does_not_take_the_second(
    owner: psycopg.Connection, connect: Connect
):
    conversation, other = uuid.uuid4(), uuid.uuid4()
    turn1, turn2 = enqueue(owner, conversation, 2)
    (other_turn,) = enqueue(owner, other)
    locker = connect(autocommit=False)
    locker.execute("SELECT id FROM runrow.agent_run WHERE id = %s FOR UPDATE", (turn1,))

    # The claimer skips the locked turn 1 and takes the other conversation's turn, which
    # was enqueued after turn 2: turn 2 was passed over because it is not first in line.
    claimer = Background(connect(), lambda conn: claim(conn, 10))
    assert [r["run_id"] for r in claimer.result()] == [other_turn]
    assert run_row(owner, turn2)["status"] == "queued"
    locker.commit()

    assert [r["run_id"] for r in claim(owner, 10)] == [turn1]
    assert run_row(owner, turn2)["status"] == "queued"


# --- f. stop vs the running turn finishing --------------------------------------------


def test_stop_waiting_on_a_finishing_turn_leaves_no_turn_to_start(
    owner: psycopg.Connection, connect: Connect
):
    conversation = uuid.uuid4()
    turn1, turn2 = enqueue(owner, conversation, 2)
    run = claim_one(owner)
    assert run["run_id"] == turn1
    worker = connect(autocommit=False)
    assert finish(worker, run) is True

    stopper = Background(connect(), lambda conn: stop(conn, conversation))
    stopper.wait_blocked_by(owner, worker)
    worker.commit()

    # Turn 1 ended before the stop reached it; the stop cancels turn 2 before it starts.
    assert stopper.result() == [(turn2, "cancelled")]
    assert claim(owner, 10) == []
    assert run_row(owner, turn1)["status"] == "completed"
    assert run_row(owner, turn2)["status"] == "cancelled"
    assert [t for _, t in journal(owner, turn2)] == ["user_message_created", "run_queued", "complete"]


def test_finish_waiting_on_a_stop_leaves_no_turn_to_start(owner: psycopg.Connection, connect: Connect):
    conversation = uuid.uuid4()
    turn1, turn2 = enqueue(owner, conversation, 2)
    run = claim_one(owner)
    stopper = connect(autocommit=False)
    assert stop(stopper, conversation) == [(turn1, "cancel_requested"), (turn2, "cancelled")]

    worker = Background(connect(), lambda conn: finish(conn, run, "cancelled"))
    worker.wait_blocked_by(owner, stopper)
    stopper.commit()

    assert worker.result() is True
    assert claim(owner, 10) == []
    assert run_row(owner, turn1)["status"] == "cancelled"
    assert run_row(owner, turn2)["status"] == "cancelled"
    assert [t for _, t in journal(owner, turn1)][-2:] == ["cancel_requested", "complete"]


def batch_finish(conn: psycopg.Connection, call: str, run: dict) -> list[tuple]:
    """End one held run through a batch call, with an event before its complete; the rows of
    the run's ending (run_id, finished, last_seq)."""
    runs = Jsonb(
        [
            {
                "run_id": str(run["run_id"]),
                "claim_token": str(run["claim_token"]),
                "status": "cancelled",
                "events": [{"type": "text", "text": "last words"}],
            }
        ]
    )
    if call == "finish_runs":
        return conn.execute(
            "SELECT run_id, finished, last_seq FROM runrow.finish_runs(%s)", (runs,)
        ).fetchall()
    rows = conn.execute(
        "SELECT run_id, finished, last_seq FROM runrow.finish_and_claim_runs(%s, max_runs => 1)", (runs,)
    ).fetchall()
    return [r for r in rows if r[1] is not None]


@pytest.mark.parametrize("call", ["finish_runs", "finish_and_claim_runs"])
def test_batch_finish_waiting_on_a_stop_journals_after_the_stops_event(
    owner: psycopg.Connection, connect: Connect, call: str
):
    """The batch endings update the run and journal it in one statement, whose snapshot is
    taken before it waits for the stop's row lock: the ending's rows must still follow the
    stop's cancel_requested, and the run's journal stay 1..n. The seq trigger reads the run's
    last seq with a snapshot of its own per row; a writer that read it in its own statement
    would reuse the stop's seq and fail on the journal's key."""
    conversation = uuid.uuid4()
    turn1, turn2 = enqueue(owner, conversation, 2)
    run = claim_one(owner)
    stopper = connect(autocommit=False)
    assert stop(stopper, conversation) == [(turn1, "cancel_requested"), (turn2, "cancelled")]

    worker = Background(connect(), lambda conn: batch_finish(conn, call, run))
    worker.wait_blocked_by(owner, stopper)
    stopper.commit()

    ended = worker.result()
    events = journal(owner, turn1)
    assert ended == [(turn1, True, events[-1][0])]
    assert_gap_free(events)
    assert [t for _, t in events][-3:] == ["cancel_requested", "text", "complete"]
    assert run_row(owner, turn1)["status"] == "cancelled"
    assert claim(owner, 10) == []


# --- g. several worker processes, thousands of runs -----------------------------------

STRESS_PROCESSES = 4
STRESS_CONVERSATIONS = 5
STRESS_RUNS = 2000
STRESS_TIMEOUT = 300  # seconds; a drain takes a few


def first_error_or_all(tasks: list, timeout: float) -> list:
    """Every task's result, or the first task error as soon as it happens. A process that
    fails leaves its run running, and the others then wait for its conversation forever:
    starmap would report the error only once they were all done, which is never (one such
    hang was tests/test_finish_and_claim_deadlock.py's deadlock)."""
    deadline = time.monotonic() + timeout
    while not all(task.ready() for task in tasks):
        for task in tasks:
            if task.ready() and not task.successful():
                task.get()  # raises the process's error
        assert time.monotonic() < deadline, f"the stress processes did not finish within {timeout} s"
        time.sleep(0.05)
    return [task.get() for task in tasks]


@pytest.mark.parametrize("worker", [stress_worker, stress_one_call_worker], ids=["claim+finish", "one call"])
def test_worker_processes_claim_every_run_once_and_one_turn_at_a_time(
    owner: psycopg.Connection, database_url: str, worker: Callable[..., list[tuple]]
):
    """Run twice: through claim_runs and finish_run, and through finish_and_claim_runs, whose
    walk runs before its endings are written and whose second claim takes the next turns of
    the conversations it ends."""
    conversations = [str(uuid.uuid4()) for _ in range(STRESS_CONVERSATIONS)]
    # Round-robin, so every conversation always has a next turn queued behind its running one.
    owner.execute(
        "SELECT runrow.enqueue_run(c.ids[1 + n %% cardinality(c.ids)], to_jsonb('turn ' || n), 'test-model')"
        " FROM (SELECT %s::uuid[] AS ids) AS c, generate_series(0, %s - 1) AS n",
        (conversations, STRESS_RUNS),
    )

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(STRESS_PROCESSES) as pool:
        tasks = [
            # Half the processes fill several slots per call (claim_runs' one-statement path).
            pool.apply_async(worker, (database_url, f"stress-{n}", conversations, 1 + 2 * (n % 2)))
            for n in range(STRESS_PROCESSES)
        ]
        per_process = first_error_or_all(tasks, STRESS_TIMEOUT)

    records = [record for records in per_process for record in records]
    assert len(records) == STRESS_RUNS
    assert len({run for _, _, run, _, _ in records}) == STRESS_RUNS
    if worker is stress_worker:
        assert all(len(records) > 0 for records in per_process), "some process never claimed a run"
    else:
        # A call that ends a turn claims that conversation's next one at once when its slots
        # allow, as finish_runs + claim_runs in one transaction would: with 5 conversations
        # and 8 slots, a conversation stays with the process that has it, and a late process
        # may find none free. The runs must still have been shared out.
        assert sum(len(records) > 0 for records in per_process) >= 2, "one process claimed every run"

    runs = owner.execute(
        "SELECT r.status, r.attempt,"
        "       count(*) FILTER (WHERE e.type = 'run_claimed'),"
        "       count(*) FILTER (WHERE e.type = 'complete')"
        " FROM runrow.agent_run AS r JOIN runrow.run_event AS e ON e.run_id = r.id"
        " WHERE r.conversation_id = ANY (%s::uuid[])"
        " GROUP BY r.id",
        (conversations,),
    ).fetchall()
    assert len(runs) == STRESS_RUNS
    assert set(runs) == {("completed", 1, 1, 1)}

    by_conversation: dict[str, list[tuple]] = {}
    for conversation, enqueue_seq, _run, started, ended in records:
        by_conversation.setdefault(conversation, []).append((started, ended, enqueue_seq))
    for intervals in by_conversation.values():
        intervals.sort()
        for (_, ended, _), (started, _, _) in itertools.pairwise(intervals):
            assert ended < started, "two runs of one conversation were running at once"
        seqs = [enqueue_seq for _, _, enqueue_seq in intervals]
        assert seqs == sorted(seqs), "turns of a conversation ran out of enqueue order"


def test_stop_waiting_on_an_uncommitted_claim_flags_the_claimed_turn(
    owner: psycopg.Connection, connect: Connect
):
    conversation = uuid.uuid4()
    turn1, turn2 = enqueue(owner, conversation, 2)
    claimer = connect(autocommit=False)
    run = claim_one(claimer)
    assert run["run_id"] == turn1

    stopper = Background(connect(), lambda conn: stop(conn, conversation))
    stopper.wait_blocked_by(owner, claimer)
    claimer.commit()

    # The turn started before the stop committed: it is asked to cancel, and the worker
    # learns it from its next heartbeat; the later turn never starts.
    assert stopper.result() == [(turn1, "cancel_requested"), (turn2, "cancelled")]
    assert heartbeat(owner, run) == (True, True)
    assert claim(owner, 10) == []


def test_claim_during_an_uncommitted_stop_takes_nothing(owner: psycopg.Connection, connect: Connect):
    conversation = uuid.uuid4()
    turn1, turn2 = enqueue(owner, conversation, 2)
    stopper = connect(autocommit=False)
    assert stop(stopper, conversation) == [(turn1, "cancelled"), (turn2, "cancelled")]

    # Turn 1 is locked by the stop and still queued in the claimer's snapshot: the claimer
    # skips it and, turn 2 not being first in line, takes nothing, without waiting.
    claimer = Background(connect(), lambda conn: claim(conn, 10))
    assert claimer.result() == []
    stopper.commit()

    assert claim(owner, 10) == []
    assert {run_row(owner, turn)["status"] for turn in (turn1, turn2)} == {"cancelled"}


def test_heartbeat_waiting_on_a_stop_reports_the_cancel(owner: psycopg.Connection, connect: Connect):
    run = claimed_running(owner)
    stopper = connect(autocommit=False)
    assert stop(stopper, run["conversation_id"]) == [(run["run_id"], "cancel_requested")]

    worker = Background(connect(), lambda conn: heartbeat(conn, run))
    worker.wait_blocked_by(owner, stopper)
    stopper.commit()

    assert worker.result() == (True, True)


# --- runs parked on a person: approval vs claim, approval vs stop, park vs stop ---------


def parked(owner: psycopg.Connection) -> tuple[uuid.UUID, dict, uuid.UUID, str]:
    """A conversation whose turn 1 waits on an approval, with turn 2 queued behind it."""
    conversation = uuid.uuid4()
    _turn1, turn2 = enqueue(owner, conversation, 2, tools=["send_wire"])
    run = claim_one(owner)
    key = tool_turn(owner, run)
    assert begin_irreversible(owner, run, key) == "needs_approval"
    assert run_row(owner, run["run_id"])["status"] == "waiting"
    return conversation, run, turn2, key


def approve(conn: psycopg.Connection, key: str) -> uuid.UUID:
    return conn.execute("SELECT runrow.resolve_approval(%s, true, 'alice')", (key,)).fetchone()[0]


def test_claim_during_an_uncommitted_approval_takes_nothing_then_the_approved_turn(
    owner: psycopg.Connection, connect: Connect
):
    _conversation, run, turn2, key = parked(owner)
    assert claim(owner, 10) == []  # turn 1 still holds its conversation while it waits
    person = connect(autocommit=False)
    assert approve(person, key) == run["run_id"]

    claimer = Background(connect(), lambda conn: claim(conn, 10))
    assert claimer.result() == []
    person.commit()

    # Requeued, turn 1 is again first in line: it resumes before turn 2 starts.
    resumed = claim(owner, 10)
    assert [r["run_id"] for r in resumed] == [run["run_id"]]
    assert resumed[0]["attempt"] == 1  # parking handed the attempt back
    assert run_row(owner, turn2)["status"] == "queued"


def test_approval_waiting_on_a_stop_is_refused(owner: psycopg.Connection, connect: Connect):
    conversation, run, turn2, key = parked(owner)
    stopper = connect(autocommit=False)
    assert stop(stopper, conversation) == [(run["run_id"], "cancelled"), (turn2, "cancelled")]

    person = Background(connect(), lambda conn: approve(conn, key))
    person.wait_blocked_by(owner, stopper)
    stopper.commit()

    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        person.result()
    assert claim(owner, 10) == []
    assert run_row(owner, run["run_id"])["status"] == "cancelled"


def test_stop_waiting_on_an_approval_cancels_the_requeued_turn(owner: psycopg.Connection, connect: Connect):
    conversation, run, turn2, key = parked(owner)
    person = connect(autocommit=False)
    assert approve(person, key) == run["run_id"]

    stopper = Background(connect(), lambda conn: stop(conn, conversation))
    stopper.wait_blocked_by(owner, person)
    person.commit()

    assert stopper.result() == [(run["run_id"], "cancelled"), (turn2, "cancelled")]
    assert claim(owner, 10) == []


def test_stop_waiting_on_a_park_cancels_the_parked_turn(owner: psycopg.Connection, connect: Connect):
    conversation = uuid.uuid4()
    turn1, turn2 = enqueue(owner, conversation, 2, tools=["send_wire"])
    run = claim_one(owner)
    key = tool_turn(owner, run)
    worker = connect(autocommit=False)
    assert begin_irreversible(worker, run, key) == "needs_approval"

    stopper = Background(connect(), lambda conn: stop(conn, conversation))
    stopper.wait_blocked_by(owner, worker)
    worker.commit()

    assert stopper.result() == [(turn1, "cancelled"), (turn2, "cancelled")]
    assert claim(owner, 10) == []


def test_park_waiting_on_a_stop_ends_the_run_cancelled(owner: psycopg.Connection, connect: Connect):
    conversation = uuid.uuid4()
    turn1, turn2 = enqueue(owner, conversation, 2, tools=["send_wire"])
    run = claim_one(owner)
    key = tool_turn(owner, run)
    stopper = connect(autocommit=False)
    assert stop(stopper, conversation) == [(turn1, "cancel_requested"), (turn2, "cancelled")]

    worker = Background(connect(), lambda conn: begin_irreversible(conn, run, key))
    worker.wait_blocked_by(owner, stopper)
    stopper.commit()

    assert worker.result() == "needs_approval"  # the worker stops either way
    assert heartbeat(owner, run) == (False, True)
    assert run_row(owner, turn1)["status"] == "cancelled"
    events = journal(owner, turn1)
    assert_gap_free(events)
    assert [t for _, t in events].count("complete") == 1
    assert claim(owner, 10) == []


# --- a person's decisions made twice at once -------------------------------------------


def test_two_retries_at_once_make_one_new_run(owner: psycopg.Connection, connect: Connect):
    run = claimed_running(owner)
    assert finish(owner, run, "failed")

    def retry(conn: psycopg.Connection) -> uuid.UUID:
        return conn.execute("SELECT runrow.retry_run(%s)", (run["run_id"],)).fetchone()[0]

    first = connect(autocommit=False)
    made = retry(first)
    second = Background(connect(), retry)
    second.wait_blocked_by(owner, first)
    first.commit()

    assert second.result() == made
    retries = owner.execute(
        "SELECT id FROM runrow.agent_run WHERE retry_of = %s", (run["run_id"],)
    ).fetchall()
    assert retries == [(made,)]


def test_two_enqueues_with_one_idempotency_key_make_one_run(owner: psycopg.Connection, connect: Connect):
    conversation, key = uuid.uuid4(), f"key-{uuid.uuid4()}"

    def enqueue_once(conn: psycopg.Connection) -> tuple:
        return conn.execute(
            "SELECT run_id, created"
            " FROM runrow.enqueue_run(%s, '\"hello\"', 'test-model', idempotency_key => %s)",
            (conversation, key),
        ).fetchone()

    first = connect(autocommit=False)
    run_id, created = enqueue_once(first)
    assert created
    second = Background(connect(), enqueue_once)
    second.wait_blocked_by(owner, first)
    first.commit()

    assert second.result() == (run_id, False)
    assert owner.execute(
        "SELECT count(*) FROM runrow.agent_run WHERE conversation_id = %s", (conversation,)
    ).fetchone() == (1,)
