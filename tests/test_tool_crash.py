"""A worker dies between begin_tool_call and complete_tool_call (its backend is killed
while idle after the committed begin); the next attempt must not repeat an unsafe effect.
Plus the full approval path, approve and reject, with real connections and NOTIFY.

Leases are 1 s and real: after a kill the test runs the reaper until the lease lapses.
"""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest
from race_support import database_url
from steps_support import (
    append_step,
    begin,
    complete,
    kill_backend,
    reap_when_lapsed,
    resolve,
    status,
    tool_turn,
)
from tail_support import claim, enqueue

from pyworker.db.keys import tool_call_key

__all__ = ["database_url"]  # fixture: this module's own database


NEEDS_APPROVAL = ("needs_approval", None)
EXECUTE = ("execute", None)
CHARGE = {"cents": 1250, "currency": "eur"}


def _owned(conn: psycopg.Connection, run_id: uuid.UUID, token: uuid.UUID) -> bool:
    return conn.execute("SELECT owned FROM runrow.heartbeat(%s, %s)", (run_id, token)).fetchone()[0]


def test_non_idempotent_call_is_executed_again_with_the_same_key(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as observer:
        run_id = enqueue(observer, "charge it", max_attempts=3, tools=["charge_card"])
        worker = psycopg.connect(database_url, autocommit=True)
        token = claim(worker, run_id, lease_seconds=1)
        key = tool_turn(worker, run_id, token, "tu_1", "charge_card", CHARGE)
        assert begin(
            worker, run_id, token, key, "charge_card", {"cents": 1250, "currency": "eur"}, "non_idempotent"
        ) == (
            "execute",
            None,
        )
        # The tool is "running" downstream with `key` when the worker's host dies.
        kill_backend(observer, worker)
        with pytest.raises(psycopg.OperationalError):
            worker.execute("SELECT 1")

        assert reap_when_lapsed(observer, run_id) == "requeued"
        token2 = claim(observer, run_id, lease_seconds=30)
        # The resumed attempt rebuilds the call from the step log and derives the same key.
        history = observer.execute(
            "SELECT seq, payload::text FROM runrow.conversation_history("
            "(SELECT conversation_id FROM runrow.agent_run WHERE id = %s), %s) WHERE source = 'step'",
            (run_id, run_id),
        ).fetchall()
        (seq, payload) = history[-1]
        block = json.loads(payload)[0]
        assert tool_call_key(run_id, seq, block["id"], block["name"], block["input"]) == key
        assert begin(observer, run_id, token2, key, "charge_card", block["input"], "non_idempotent") == (
            "execute",
            None,
        )
        assert complete(observer, run_id, token2, key, {"charge": "ch_1"}) == seq + 1
        # Any later attempt sees the recorded result and never charges again.
        assert begin(observer, run_id, token2, key, "charge_card", block["input"], "non_idempotent") == (
            "done",
            {"charge": "ch_1"},
        )
        worker.close()


def test_approved_irreversible_call_comes_back_uncertain(database_url: str) -> None:
    args = {"table": "customers"}
    with psycopg.connect(database_url, autocommit=True) as observer:
        run_id = enqueue(observer, "drop it", max_attempts=2, tools=["drop_table"])
        token = claim(observer, run_id)
        key = tool_turn(observer, run_id, token, "tu_drop", "drop_table", args)
        assert begin(observer, run_id, token, key, "drop_table", args, "irreversible") == (
            "needs_approval",
            None,
        )
        assert (
            observer.execute("SELECT runrow.resolve_approval(%s, true, 'alice')", (key,)).fetchone()[0]
            == run_id
        )

        worker = psycopg.connect(database_url, autocommit=True)
        token2 = claim(worker, run_id, lease_seconds=1)
        state, decision = begin(worker, run_id, token2, key, "drop_table", args, "irreversible")
        assert (state, decision["decided_by"]) == ("approved", "alice")
        # The worker starts the DROP and its backend dies before complete_tool_call.
        kill_backend(observer, worker)

        assert reap_when_lapsed(observer, run_id) == "requeued"
        token3 = claim(observer, run_id)
        assert begin(observer, run_id, token3, key, "drop_table", args, "irreversible") == ("uncertain", None)
        assert status(observer, run_id) == "waiting"
        assert not _owned(observer, run_id, token3)
        pending = observer.execute(
            "SELECT reason, previously_decided_by FROM runrow.pending_approvals WHERE idempotency_key = %s",
            (key,),
        ).fetchall()
        assert pending == [("uncertain", "alice")]
        worker.close()


def test_full_approval_path(database_url: str) -> None:
    args = {"to": "ops@example.com", "subject": "restart"}
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        psycopg.connect(database_url, autocommit=True) as listener,
    ):
        run_id = enqueue(conn, "restart prod", tools=["restart_service"])
        conversation_id = conn.execute(
            "SELECT conversation_id FROM runrow.agent_run WHERE id = %s", (run_id,)
        ).fetchone()[0]
        listener.execute("LISTEN runrow_enqueued")

        token = claim(conn, run_id)
        key = tool_turn(conn, run_id, token, "tu_r", "restart_service", args)
        assert begin(conn, run_id, token, key, "restart_service", args, "irreversible") == (
            "needs_approval",
            None,
        )
        assert status(conn, run_id) == "waiting"
        assert not _owned(conn, run_id, token)
        assert conn.execute("SELECT count(*) FROM runrow.claim_run('other')").fetchone()[0] == 0

        assert (
            conn.execute("SELECT runrow.resolve_approval(%s, true, 'bob', 'go')", (key,)).fetchone()[0]
            == run_id
        )
        wakes = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
        assert wakes == [str(conversation_id)]
        assert status(conn, run_id) == "queued"

        token2 = claim(conn, run_id)
        assert begin(conn, run_id, token2, key, "restart_service", args, "irreversible")[0] == "approved"
        seq = complete(conn, run_id, token2, key, "restarted")
        assert (
            append_step(conn, run_id, token2, "model_turn", '[{"type":"text","text":"Restarted."}]')
            == seq + 1
        )
        assert conn.execute("SELECT runrow.finish_run(%s, %s, 'completed')", (run_id, token2)).fetchone()[0]
        assert status(conn, run_id) == "completed"
        rows = conn.execute(
            "SELECT role, kind, payload::text FROM runrow.conversation_history(%s, %s) WHERE source = 'step'",
            (conversation_id, run_id),
        ).fetchall()
        assert [(r[0], r[1]) for r in rows] == [
            ("assistant", "model_turn"),
            ("user", "tool_result"),
            ("assistant", "model_turn"),
        ]
        assert json.loads(rows[1][2]) == {
            "type": "tool_result",
            "tool_use_id": "tu_r",
            "content": "restarted",
            "is_error": False,
        }


def test_rejection_reaches_the_model_as_an_error(database_url: str) -> None:
    args = {"id": 42}
    with psycopg.connect(database_url, autocommit=True) as conn:
        run_id = enqueue(conn, "delete user 42", tools=["delete_user"])
        token = claim(conn, run_id)
        key = tool_turn(conn, run_id, token, "tu_d", "delete_user", args)
        assert begin(conn, run_id, token, key, "delete_user", args, "irreversible") == (
            "needs_approval",
            None,
        )
        resolve(conn, key, False, "carol", "not without a ticket")

        token2 = claim(conn, run_id)
        state, decision = begin(conn, run_id, token2, key, "delete_user", args, "irreversible")
        assert state == "rejected"
        assert (decision["approved"], decision["decided_by"], decision["note"]) == (
            False,
            "carol",
            "not without a ticket",
        )
        message = f"Rejected by {decision['decided_by']}: {decision['note']}"
        seq = complete(conn, run_id, token2, key, message)
        payload = conn.execute(
            "SELECT payload::text FROM runrow.agent_step WHERE run_id = %s AND seq = %s", (run_id, seq)
        ).fetchone()[0]
        assert json.loads(payload) == {
            "type": "tool_result",
            "tool_use_id": "tu_d",
            "content": "Rejected by carol: not without a ticket",
            "is_error": True,
        }
        assert conn.execute("SELECT runrow.finish_run(%s, %s, 'completed')", (run_id, token2)).fetchone()[0]
