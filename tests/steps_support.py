"""Support for the step-log and tool-call tests: a worker's SQL calls, one line each.

Every call is a `SELECT runrow.fn(...)`, as the reference worker makes them. Payloads go
in as str with `%s::json` and come back with `payload::text`, so no JSON parser ever
touches the bytes.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import psycopg

from pyworker.db.keys import tool_call_key

DEADLINE = 15.0


def tool_defs(*names: str) -> str:
    """enqueue_run's `tools` (JSON text) offering `names`, each taking any object: begin_tool_call
    runs only a tool its run was enqueued with."""
    return json.dumps([{"name": n, "input_schema": {"type": "object"}} for n in names])


def append_step(
    conn: psycopg.Connection, run_id: uuid.UUID, token: uuid.UUID, kind: str, payload: str
) -> int | None:
    return conn.execute(
        "SELECT runrow.append_step(run_id => %s, claim_token => %s, kind => %s, payload => %s::json)",
        (run_id, token, kind, payload),
    ).fetchone()[0]


def tool_turn(
    conn: psycopg.Connection, run_id: uuid.UUID, token: uuid.UUID, tool_use_id: str, tool: str, args: dict
) -> str:
    """Append a model turn calling one tool; return the call's idempotency key."""
    block = {"type": "tool_use", "id": tool_use_id, "name": tool, "input": args}
    seq = append_step(conn, run_id, token, "model_turn", json.dumps([block]))
    assert seq is not None
    return tool_call_key(run_id, seq, tool_use_id, tool, args)


def begin(
    conn: psycopg.Connection,
    run_id: uuid.UUID,
    token: uuid.UUID,
    key: str,
    tool: str,
    args: dict,
    effect: str,
) -> tuple[str, Any] | None:
    return conn.execute(
        "SELECT state, result FROM runrow.begin_tool_call(run_id => %s, claim_token => %s,"
        " idempotency_key => %s, tool => %s, args => %s::jsonb, effect => %s)",
        (run_id, token, key, tool, json.dumps(args), effect),
    ).fetchone()


def complete(
    conn: psycopg.Connection,
    run_id: uuid.UUID,
    token: uuid.UUID,
    key: str,
    result: Any,
    is_error: bool = False,
) -> int | None:
    return conn.execute(
        "SELECT runrow.complete_tool_call(run_id => %s, claim_token => %s, idempotency_key => %s,"
        " result => %s::jsonb, is_error => %s)",
        (run_id, token, key, json.dumps(result), is_error),
    ).fetchone()[0]


def status(conn: psycopg.Connection, run_id: uuid.UUID) -> str:
    return conn.execute("SELECT status FROM runrow.agent_run WHERE id = %s", (run_id,)).fetchone()[0]


def kill_backend(observer: psycopg.Connection, victim: psycopg.Connection) -> None:
    """Terminate the victim's server process, as a crashed worker host would lose it, and
    return once the server no longer lists it."""
    pid = victim.info.backend_pid
    assert observer.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
    deadline = time.monotonic() + DEADLINE
    while observer.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]:
        assert time.monotonic() < deadline, f"backend {pid} is still alive"
        time.sleep(0.01)


def reap_when_lapsed(conn: psycopg.Connection, run_id: uuid.UUID) -> str:
    """Run the reaper (grace 0) until the run's real lease lapses and it is reaped."""
    deadline = time.monotonic() + DEADLINE
    while True:
        rows = conn.execute(
            "SELECT run_id, outcome FROM runrow.reap_expired_runs(grace_seconds => 0)"
        ).fetchall()
        outcomes = {r: o for r, o in rows}
        if run_id in outcomes:
            return outcomes[run_id]
        assert time.monotonic() < deadline, f"run {run_id} was never reaped"
        time.sleep(0.05)


def resolve(
    conn: psycopg.Connection, key: str, approved: bool, who: str, note: str | None = None
) -> uuid.UUID:
    return conn.execute(
        "SELECT runrow.resolve_approval(%s, %s, %s, %s)", (key, approved, who, note)
    ).fetchone()[0]


def conversation_of(conn: psycopg.Connection, run_id: uuid.UUID) -> uuid.UUID:
    return conn.execute("SELECT conversation_id FROM runrow.agent_run WHERE id = %s", (run_id,)).fetchone()[0]
