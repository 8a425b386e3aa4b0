"""A holder frozen inside its transaction (a worker paused or cut off mid-flush) stalls nobody.

The holder is a real session that made a worker's journal write (append_events) in an open
transaction and then does nothing, exactly what a SIGSTOPped worker's flush leaves behind. While
it holds the run's row lock: every reaper skips that run, reaps the other expired runs and
returns; a stop, a cancel or an interrupting enqueue gives up after its lock_timeout with 55P03
naming the run and writes nothing, over SQL, HTTP (503 + Retry-After) and the CLI (exit 75).
Once the holder is gone the same calls go through. The real-process version, with a worker
SIGSTOPped mid-flush and the server's own timeout ending it, is in test_worker_sigstop.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from http_support import ALICE, Server, serve
from psycopg.types.json import Jsonb
from race_support import (
    Background,
    Connect,
    claim_one,
    database_url,
    enqueue,
    expire_lease,
    journal,
    owner,
    run_row,
)
from worker_support import REPO

from pyworker.db.session_limits import worker_connection_kwargs

__all__ = ["database_url", "owner"]  # fixtures: this module's own database, the observer

# The stop functions' lock_timeout is 5 s; this only says "returned instead of hanging".
WITHIN = 30.0


def hold(connect: Connect, run: dict) -> psycopg.Connection:
    """A session that journaled into the run inside a transaction it never ends (until told)."""
    holder = connect(autocommit=False)
    seq = holder.execute(
        "SELECT runrow.append_events(%s, %s, %s)",
        (run["run_id"], run["claim_token"], Jsonb([{"type": "text_delta", "index": 0, "text": "stuck"}])),
    ).fetchone()[0]
    assert seq is not None
    return holder


def reap(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute("SELECT run_id, outcome FROM runrow.reap_expired_runs(grace_seconds => 0)").fetchall()


def state(conn: psycopg.Connection, conversation: uuid.UUID) -> list[tuple]:
    """Every row and journal entry of a conversation: equal before and after = nothing written."""
    return conn.execute(
        "SELECT r.id, r.status, r.cancel_requested, r.claim_token, r.updated_at, m.status,"
        "       (SELECT array_agg(e.type ORDER BY e.seq) FROM runrow.run_event AS e WHERE e.run_id = r.id)"
        " FROM runrow.agent_run AS r JOIN runrow.message AS m ON m.id = r.user_message_id"
        " WHERE r.conversation_id = %s ORDER BY r.enqueue_seq",
        (conversation,),
    ).fetchall()


def assert_names_the_frozen_run(exc: BaseException, run_id: uuid.UUID) -> None:
    assert isinstance(exc, psycopg.errors.LockNotAvailable), repr(exc)
    assert exc.diag.message_primary == (
        f"run {run_id} is locked by an unresponsive session (no answer within 5s): nothing was stopped"
    )
    hint = exc.diag.message_hint or ""
    assert "idle_in_transaction_session_timeout" in hint and "reaper" in hint and "retry" in hint


def failure(call: Background) -> BaseException:
    with pytest.raises(psycopg.Error) as caught:
        call.result(WITHIN)
    return caught.value


def frozen_turn(owner: psycopg.Connection) -> tuple[uuid.UUID, dict, uuid.UUID]:
    """A conversation whose turn 1 is running and turn 2 queued behind it."""
    conversation = uuid.uuid4()
    _turn1, turn2 = enqueue(owner, conversation, 2, max_attempts=2)
    run = claim_one(owner)
    return conversation, run, turn2


def test_reaper_skips_the_frozen_holders_run_and_reaps_the_others(
    owner: psycopg.Connection, connect: Connect
):
    _conversation, frozen, _turn2 = frozen_turn(owner)
    (other_id,) = enqueue(owner, uuid.uuid4())
    other = claim_one(owner)
    assert other["run_id"] == other_id
    # Both leases lapsed, the frozen run's first: a reaper that waited on a row would wait on
    # it before ever reaching the other. (Its lease is set before the holder locks the row.)
    owner.execute(
        "UPDATE runrow.agent_run SET claim_expires_at = now() - interval '1 minute' WHERE id = %s",
        (frozen["run_id"],),
    )
    holder = hold(connect, frozen)
    expire_lease(owner, other["run_id"])

    reaper = Background(connect(), reap)
    assert reaper.result(WITHIN) == [(other["run_id"], "failed")]
    row = run_row(owner, frozen["run_id"])
    assert (row["status"], row["claim_token"]) == ("running", frozen["claim_token"])
    assert reap(owner) == []  # every pass skips it while the holder is there

    # The holder's session ends (PostgreSQL's timeout, or here a rollback): the next pass takes it.
    holder.rollback()
    assert reap(owner) == [(frozen["run_id"], "requeued")]
    assert [t for _, t in journal(owner, frozen["run_id"])][-1] == "run_requeued"


def test_stop_cancel_and_interrupt_give_up_on_a_frozen_holder_and_write_nothing(
    owner: psycopg.Connection, connect: Connect
):
    conversation, frozen, turn2 = frozen_turn(owner)
    holder = hold(connect, frozen)
    before = state(owner, conversation)

    # A stop and a cancel at once: both fail within the bound, naming the run.
    stopper = Background(
        connect(),
        lambda conn: conn.execute("SELECT * FROM runrow.stop_conversation(%s)", (conversation,)).fetchall(),
    )
    canceller = Background(
        connect(), lambda conn: conn.execute("SELECT runrow.cancel_run(%s)", (frozen["run_id"],)).fetchone()
    )
    assert_names_the_frozen_run(failure(stopper), frozen["run_id"])
    assert_names_the_frozen_run(failure(canceller), frozen["run_id"])
    # All or nothing: the queued turn 2 was not cancelled without turn 1 being flagged.
    assert state(owner, conversation) == before

    interrupter = Background(
        connect(),
        lambda conn: conn.execute(
            "SELECT * FROM runrow.enqueue_run(%s, '\"now this\"', 'test-model', if_active => 'interrupt')",
            (conversation,),
        ).fetchall(),
    )
    assert_names_the_frozen_run(failure(interrupter), frozen["run_id"])
    assert state(owner, conversation) == before  # no new turn either

    # Once the holder is gone the same stop goes through.
    holder.rollback()
    assert owner.execute("SELECT * FROM runrow.stop_conversation(%s)", (conversation,)).fetchall() == [
        (frozen["run_id"], "cancel_requested"),
        (turn2, "cancelled"),
    ]


def elapsed_failing(call: Background) -> float:
    """Seconds from now until the call fails (it must fail with 55P03)."""
    started = time.monotonic()
    error = failure(call)
    assert isinstance(error, psycopg.errors.LockNotAvailable), repr(error)
    return time.monotonic() - started


# A stop waits at most 5 s; behind another stop of the same run it waited 5 s in the row's
# queue of lockers and 5 s more for the holder (10 s; the audit). Halfway between the two.
BOUND = 7.5


@pytest.mark.parametrize("stop", ["cancel_run", "stop_conversation"])
def test_a_stop_behind_another_stop_answers_within_its_5s(
    owner: psycopg.Connection, connect: Connect, stop: str
):
    conversation, frozen, _turn2 = frozen_turn(owner)
    holder = hold(connect, frozen)
    before = state(owner, conversation)
    sql, arg = (
        ("SELECT runrow.cancel_run(%s)", frozen["run_id"])
        if stop == "cancel_run"
        else ("SELECT * FROM runrow.stop_conversation(%s)", conversation)
    )
    first = Background(connect(), lambda conn: conn.execute(sql, (arg,)).fetchall())
    first.wait_blocked_by(owner, holder)
    second_conn = connect()
    second = Background(second_conn, lambda conn: conn.execute(sql, (arg,)).fetchall())
    second.wait_blocked_by(owner, first.conn)  # queued behind the first stop, not the holder
    assert elapsed_failing(second) < BOUND
    assert isinstance(failure(first), psycopg.errors.LockNotAvailable)
    assert state(owner, conversation) == before
    holder.rollback()


def test_a_stop_behind_a_stuck_enqueue_names_the_conversation(owner: psycopg.Connection, connect: Connect):
    conversation = uuid.uuid4()
    enqueue(owner, conversation)
    before = state(owner, conversation)
    # A session that enqueued a turn and never commits holds the conversation's lock.
    stuck = connect(autocommit=False)
    enqueue(stuck, conversation)

    stopper = Background(
        connect(), lambda conn: conn.execute("SELECT * FROM runrow.stop_conversation(%s)", (conversation,))
    )
    error = failure(stopper)
    assert isinstance(error, psycopg.errors.LockNotAvailable)
    assert error.diag.message_primary == (
        f"conversation {conversation} is being changed by another session that did not finish within 5s:"
        " nothing was stopped"
    )
    assert state(owner, conversation) == before
    stuck.rollback()


# --- the same over HTTP and the CLI -------------------------------------------------------


@pytest.fixture(scope="module")
def server(database_url: str) -> Iterator[Server]:
    yield from serve(database_url)


def test_http_stop_cancel_and_interrupt_answer_503_with_retry_after(
    owner: psycopg.Connection, connect: Connect, server: Server
):
    with httpx.Client(base_url=server.url, timeout=WITHIN) as client:
        conversation = uuid.uuid4()
        enqueued = client.post(f"/conversations/{conversation}/runs", json={"content": "hi"}, headers=ALICE)
        assert enqueued.status_code == 202, enqueued.text
        run = claim_one(owner)
        assert str(run["run_id"]) == enqueued.json()["run_id"]
        holder = hold(connect, run)
        before = state(owner, conversation)

        answers: dict[str, httpx.Response] = {}

        def post(name: str, path: str, body: dict | None = None) -> None:
            answers[name] = client.post(path, json=body, headers=ALICE)

        calls = [
            threading.Thread(target=post, args=("stop", f"/conversations/{conversation}/stop")),
            threading.Thread(target=post, args=("cancel", f"/runs/{run['run_id']}/cancel")),
            threading.Thread(
                target=post,
                args=(
                    "interrupt",
                    f"/conversations/{conversation}/runs",
                    {"content": "no", "if_active": "interrupt"},
                ),
            ),
        ]
        for call in calls:
            call.start()
        for call in calls:
            call.join(WITHIN)
            assert not call.is_alive(), f"no answer within {WITHIN} s"
        frozen_run = f"run {run['run_id']} is locked by an unresponsive session"
        busy_conversation = f"conversation {conversation} is being changed by another session"
        named = {}
        for name in ("stop", "cancel", "interrupt"):
            answer = answers[name]
            assert answer.status_code == 503, (name, answer.text)
            assert answer.headers["retry-after"] == "5"
            error = answer.json()["error"]
            assert error["type"] == "locked"
            assert "retry the stop" in error["message"]
            named[name] = error["message"]
        # cancel locks the run alone. stop and interrupt both take the conversation's lock
        # first: whichever gets it waits on the frozen run and says so; the other may time out
        # behind it on the conversation and say that instead (which one is the scheduler's
        # choice). Either way nobody answers before its wait, and somebody names the run.
        assert named["cancel"].startswith(frozen_run)
        for name in ("stop", "interrupt"):
            assert named[name].startswith((frozen_run, busy_conversation)), (name, named[name])
        assert named["stop"].startswith(frozen_run) or named["interrupt"].startswith(frozen_run), named
        assert state(owner, conversation) == before

        holder.rollback()
        stopped = client.post(f"/conversations/{conversation}/stop", headers=ALICE)
        assert stopped.status_code == 200
        assert stopped.json()["runs"] == [{"run_id": str(run["run_id"]), "action": "cancel_requested"}]


def runrow_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": url, "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pyworker", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=WITHIN * 2,
        cwd=REPO,
    )


def test_cli_stop_and_cancel_print_one_line_and_exit_75(
    owner: psycopg.Connection, connect: Connect, database_url: str
):
    conversation, run, _turn2 = frozen_turn(owner)
    holder = hold(connect, run)
    before = state(owner, conversation)

    results: dict[str, subprocess.CompletedProcess[str]] = {}

    def call(name: str, *args: str) -> None:
        results[name] = runrow_cli(database_url, *args)

    calls = [
        threading.Thread(target=call, args=("stop", "stop", str(conversation))),
        threading.Thread(target=call, args=("cancel", "cancel", str(run["run_id"]))),
    ]
    for thread in calls:
        thread.start()
    for thread in calls:
        thread.join(WITHIN * 2)
        assert not thread.is_alive(), f"the command did not end within {WITHIN * 2} s"
    for name in ("stop", "cancel"):
        result = results[name]
        assert result.returncode == 75, (name, result.stderr)
        assert result.stdout == ""
        assert result.stderr.startswith(
            f"runrow: busy: run {run['run_id']} is locked by an unresponsive session"
        )
        assert "retry the stop" in result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert state(owner, conversation) == before
    holder.rollback()


# --- the session limits a worker connects with ------------------------------------------


def test_worker_session_limits_follow_the_lease_and_yield_to_the_deployments_own(database_url: str):
    kwargs = worker_connection_kwargs(database_url, 30)
    assert {
        k: kwargs[k] for k in ("keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count")
    } == {
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 4,
    }
    assert kwargs["tcp_user_timeout"] == 30000
    with psycopg.connect(database_url, **kwargs) as conn:
        shown = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]
            for name in ("idle_in_transaction_session_timeout", "statement_timeout")
        }
    assert shown == {"idle_in_transaction_session_timeout": "30s", "statement_timeout": "5min"}

    # A setting in the connection string wins: libpq parameters are left alone, -c options go last.
    own = (
        database_url
        + ("&" if "?" in database_url else "?")
        + "keepalives_idle=99&options=-c%20statement_timeout%3D7s"
    )
    kwargs = worker_connection_kwargs(own, 30)
    assert "keepalives_idle" not in kwargs
    with psycopg.connect(own, **kwargs) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "7s"
        assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0] == "30s"
