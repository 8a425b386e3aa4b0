"""Text an earlier attempt streamed and a resumed attempt redid is taken back (issue 9, defect 7).

A real agent worker process is SIGKILLed while a model turn streams; another worker reaps the
run and resumes it from the step log, streaming that turn again. The journal then holds the
cut-off partial text and the full text. The resumed attempt journals one `superseded` event
{after_seq, through_seq, attempt}: the deltas in (after_seq, through_seq] are not the answer.

- `runrow tail`, piped (followed live through the kill, and again afterwards): stdout is
  exactly result.text.
- The SSE service relays the event as is; a client that drops the deltas it names has the
  committed narration plus the answer, with no cut-off partial.
(The chat page: tests/test_chat_page_browser.py.)
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
from agent_support import QUICK_TAKEOVER, ForkedWorker, agent_env
from http_support import ALICE, read_stream, serve
from psycopg.types.json import Jsonb
from worker_support import REPO, db, events, run_row, streamed_text, wait_status, wait_until, worker_db

from pyworker.fake.scenarios import Text, ToolCall, script, turn
from pyworker.fake.server import FakeModel

__all__ = ["db", "worker_db"]

TERMINAL = {"completed", "failed", "cancelled", "dead"}
# 2 s leases: a loaded machine must not reap a healthy worker (one more attempt, one more event).
TAKEOVER = {**QUICK_TAKEOVER, "lease_seconds": 2}
NARRATION = "Let me look at the workspace first."
ANSWER = " ".join(f"a{i:03d}" for i in range(120))  # every piece unique: a repeat shows
ONE_TURN = script(turn(Text(ANSWER)))
TOOL_THEN_ANSWER = script(turn(Text(NARRATION), ToolCall("list_files", {"path": "."})), turn(Text(ANSWER)))


def enqueue(conn: psycopg.Connection, user: str | None = None) -> uuid.UUID:
    row = conn.execute(
        "SELECT run_id FROM runrow.enqueue_run(conversation_id => %s, content => %s, "
        "model => 'claude-fake-1', user_id => %s, max_attempts => 3, metadata => %s)",
        (uuid.uuid4(), Jsonb("Answer at length."), user, Jsonb({"max_tokens": 4096})),
    ).fetchone()
    assert row is not None
    return row[0]


def tail_process(url: str, run_id: uuid.UUID) -> subprocess.Popen[str]:
    """`runrow tail RUN` with stdout and stderr piped, as a script would run it."""
    return subprocess.Popen(
        [sys.executable, "-m", "pyworker", "tail", str(run_id)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "DATABASE_URL": url, "NO_COLOR": "1"},
    )


def streaming_after(conn: psycopg.Connection, run_id: uuid.UUID, after_type: str | None) -> bool:
    """A text delta is journaled after the last `after_type` event (or at all), and no model_turn
    has closed it: the worker is mid-text in an uncommitted turn."""
    journal = events(conn, run_id)
    start = max((e["seq"] for e in journal if e["type"] == after_type), default=0) if after_type else 0
    if after_type and start == 0:
        return False
    later = [e["type"] for e in journal if e["seq"] > start]
    return "text_delta" in later and "model_turn" not in later


def kill_mid_text_and_resume(
    url: str, conn: psycopg.Connection, fake: FakeModel, demo_dir: Path, run_id: uuid.UUID, after: str | None
) -> None:
    env = agent_env(fake.base_url, demo_dir)
    a = ForkedWorker(url, "cut-off", env, **TAKEOVER)
    b: ForkedWorker | None = None
    try:
        wait_until(lambda: streaming_after(conn, run_id, after), 30, "mid-text", interval=0.01)
        a.kill()
        b = ForkedWorker(url, "resumer", env, **TAKEOVER)
        assert wait_status(conn, run_id, TERMINAL, 60) == "completed"
    finally:
        a.kill()
        if b is not None:
            b.kill()
    assert run_row(conn, run_id)["attempt"] == 2


def superseded_events(conn: psycopg.Connection, run_id: uuid.UUID) -> list[dict[str, Any]]:
    return [e for e in events(conn, run_id) if e["type"] == "superseded"]


def claims(conn: psycopg.Connection, run_id: uuid.UUID) -> list[int]:
    return [e["seq"] for e in events(conn, run_id) if e["type"] == "run_claimed"]


def test_piped_runrow_tail_prints_exactly_the_answer_after_a_resume_mid_text(
    db: psycopg.Connection, worker_db: str, tmp_path: Path
) -> None:
    with FakeModel(ONE_TURN, delta_delay=0.03) as fake:
        run_id = enqueue(db)
        live = tail_process(worker_db, run_id)
        try:
            kill_mid_text_and_resume(worker_db, db, fake, tmp_path, run_id, None)
            out, err = live.communicate(timeout=60)
        finally:
            live.kill()
    result = run_row(db, run_id)["result"]
    assert result["text"] == ANSWER
    streamed = streamed_text(db, run_id)
    assert streamed != ANSWER and streamed.endswith(ANSWER), "the journal holds the cut-off partial too"
    first, second = claims(db, run_id)
    (superseded,) = superseded_events(db, run_id)
    # Nothing committed before the cut: everything the first attempt streamed is taken back.
    assert superseded == {
        "seq": superseded["seq"],
        "type": "superseded",
        "after_seq": first,
        "through_seq": second - 1,
        "attempt": 2,
    }
    assert live.returncode == 0, err
    assert out == ANSWER, "followed live through the kill and the resume"
    assert "superseded" in err
    again = tail_process(worker_db, run_id)
    out, err = again.communicate(timeout=60)
    assert (again.returncode, out) == (0, ANSWER), err


def test_sse_relays_superseded_and_a_client_honouring_it_shows_no_cut_off_text(
    db: psycopg.Connection, worker_db: str, tmp_path: Path
) -> None:
    with FakeModel(TOOL_THEN_ANSWER, delta_delay=0.03) as fake:
        for server in serve(worker_db):
            with (
                httpx.Client(base_url=server.url, timeout=60) as client,
                concurrent.futures.ThreadPoolExecutor(1) as pool,
            ):
                run_id = enqueue(db, user="alice")
                stream = pool.submit(read_stream, client, run_id, ALICE, timeout=60)
                # Cut in the second model turn: the first (narration + tool call) is committed.
                kill_mid_text_and_resume(worker_db, db, fake, tmp_path, run_id, "tool_result")
                frames = stream.result(timeout=60).events
    assert frames[-1].event == "complete" and frames[-1].data["status"] == "completed"
    journal = events(db, run_id)
    assert [(f.id, f.event, f.data) for f in frames] == [(e["seq"], e["type"], strip(e)) for e in journal]
    (superseded,) = [f.data for f in frames if f.event == "superseded"]
    last_tool_result = max(e["seq"] for e in journal if e["type"] == "tool_result")
    # The committed turn and its tool result stay; only the cut second turn is taken back.
    assert superseded["after_seq"] == last_tool_result
    assert superseded["through_seq"] == claims(db, run_id)[-1] - 1
    naive = "".join(f.data["text"] for f in frames if f.event == "text_delta")
    kept = "".join(
        f.data["text"]
        for f in frames
        if f.event == "text_delta" and not superseded["after_seq"] < f.id <= superseded["through_seq"]
    )
    assert naive != NARRATION + ANSWER, "without honouring the event, the cut-off partial shows"
    assert kept == NARRATION + ANSWER
    assert run_row(db, run_id)["result"]["text"] == ANSWER
    # Piped, runrow tail leaves the narration before the tool call on stderr: stdout is the answer.
    tail = tail_process(worker_db, run_id)
    out, err = tail.communicate(timeout=60)
    assert (tail.returncode, out) == (0, ANSWER), err
    assert NARRATION in err


def strip(event: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps({k: v for k, v in event.items() if k != "seq"}))
