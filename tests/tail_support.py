"""Support for the tail, CLI, step and HTTP tests: a private database and a scripted run writer
(enqueue, claim, append, finish through the runrow.* functions).

Claiming takes the oldest claimable run, so a test that claims its own run needs a
database where no other test leaves queued runs behind: each module gets its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import psycopg
import pytest
from steps_support import tool_defs

from pyworker.db.devdb import temporary_database


@pytest.fixture(scope="module")
def private_database_url(database_url: str) -> Iterator[str]:
    """A freshly migrated database of this test module's own; dropped afterwards."""
    with temporary_database(database_url, "runrow_tail") as url:
        yield url


def enqueue(
    conn: psycopg.Connection,
    text: str = "hello",
    conversation_id: uuid.UUID | None = None,
    max_attempts: int = 1,
    tools: Sequence[str] = (),
) -> uuid.UUID:
    """A turn offered `tools` (steps_support.tool_defs): only those can be begun."""
    row = conn.execute(
        "SELECT run_id FROM runrow.enqueue_run(conversation_id => %s, content => %s::jsonb,"
        " model => 'test-model', max_attempts => %s, tools => %s::jsonb)",
        (conversation_id or uuid.uuid4(), json.dumps(text), max_attempts, tool_defs(*tools)),
    ).fetchone()
    assert row is not None
    return row[0]


def claim(conn: psycopg.Connection, run_id: uuid.UUID, lease_seconds: int = 60) -> uuid.UUID:
    """Claim the given run; the private database holds no other queued run, so it is ours."""
    row = conn.execute(
        "SELECT run_id, claim_token FROM runrow.claim_run(worker_id => 'test', lease_seconds => %s)",
        (lease_seconds,),
    ).fetchone()
    assert row is not None and row[0] == run_id, f"expected to claim {run_id}, got {row}"
    return row[1]


def append(conn: psycopg.Connection, run_id: uuid.UUID, token: uuid.UUID, events: list[dict]) -> int:
    row = conn.execute(
        "SELECT runrow.append_events(run_id => %s, claim_token => %s, events => %s::jsonb)",
        (run_id, token, json.dumps(events)),
    ).fetchone()
    assert row is not None and row[0] is not None, "append was fenced out"
    return row[0]


def finish(
    conn: psycopg.Connection,
    run_id: uuid.UUID,
    token: uuid.UUID,
    status: str = "completed",
    error: str | None = None,
) -> None:
    row = conn.execute(
        "SELECT runrow.finish_run(run_id => %s, claim_token => %s, status => %s, error => %s)",
        (run_id, token, status, error),
    ).fetchone()
    assert row is not None and row[0] is True


def finished_run(conn: psycopg.Connection, texts: list[str], status: str = "completed") -> uuid.UUID:
    """A run that streamed `texts` as text_delta events and ended with `status`."""
    run_id = enqueue(conn)
    token = claim(conn, run_id)
    if texts:
        append(conn, run_id, token, [{"type": "text_delta", "text": t} for t in texts])
    finish(conn, run_id, token, status, error=None if status == "completed" else f"ended {status}")
    return run_id


def journal(conn: psycopg.Connection, run_id: uuid.UUID) -> list[tuple[int, dict]]:
    rows = conn.execute(
        "SELECT seq, payload FROM runrow.read_events(run_id => %s, after_seq => 0, max_events => 10000)",
        (run_id,),
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def tail_process(url: str, run_id: uuid.UUID) -> subprocess.Popen[str]:
    """`runrow tail RUN` in a process of its own on `url` (no RUNROW_LISTEN_URL: its LISTEN goes
    where its queries go), its output captured as text, without colour."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "RUNROW_LISTEN_URL")}
    env.update(DATABASE_URL=url, NO_COLOR="1")
    return subprocess.Popen(
        [sys.executable, "-m", "pyworker", "tail", str(run_id)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
    )
