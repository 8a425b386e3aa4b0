"""U+0000 from the model, through a real `runrow worker` process and the fake Messages API.

jsonb (the journal, a run's result, tool arguments) cannot hold U+0000; json (the step log) keeps
the escape \\u0000 verbatim. A NUL in the model's text must not cost a single extra model call:
the run completes with the NUL in its result, its step log and its journal (nul-percent encoded,
pyworker/db/nul.py). A NUL in a tool's input cannot be recorded for the tool call (tool_effect.args
is jsonb): that refusal recurs on every attempt, so the run fails once, after one model call,
with an error that says so; it is never released for another paid attempt.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from agent_support import THINKING, agent_worker, enqueue_agent, steps, undecorated
from http_support import ALICE, read_stream, serve
from worker_support import REPO, WorkerProcess, db, events, run_row, wait_status, worker_db

from pyworker.db import nul
from pyworker.demo import tools as demo_tools
from pyworker.fake.scenarios import NUL_TEXT
from pyworker.fake.server import FakeModel

__all__ = ["db", "worker_db"]

TERMINAL = {"completed", "failed", "cancelled", "dead"}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModel]:
    with FakeModel("nul_text") as server:
        yield server


@pytest.fixture
def worker(worker_db: str, fake: FakeModel, tmp_path: Path) -> Iterator[WorkerProcess]:
    fake.reset()
    w = agent_worker(worker_db, "nul-worker", fake.base_url, tmp_path, "--lease", "5", "--poll", "0.2")
    try:
        w.wait_started()
        yield w
    finally:
        w.close()


def decoded_events(db: psycopg.Connection, run_id: uuid.UUID) -> list[dict[str, Any]]:
    return [nul.decode(e) for e in events(db, run_id)]


def test_a_nul_in_the_models_text_completes_the_run_with_the_nul_kept_everywhere(
    worker_db: str, db: psycopg.Connection, fake: FakeModel, worker: WorkerProcess
) -> None:
    fake.set_scenario("nul_text")
    conversation_id = uuid.uuid4()
    run_id = enqueue_agent(db, "Say something odd.", conversation_id=conversation_id, metadata=THINKING)
    assert wait_status(db, run_id, TERMINAL, 30) == "completed", (run_row(db, run_id), worker.log())
    assert fake.request_count == 1, "one model call, no paid retry"

    row = run_row(db, run_id)
    assert nul.decode(row["result"]) == {"text": NUL_TEXT, "stop_reason": "end_turn"}
    # The step log holds the bytes the SDK produced: the NUL as the escape \u0000, verbatim.
    [(_, kind, payload)] = steps(db, run_id)
    assert kind == "model_turn" and "\\u0000" in payload
    assert json.loads(payload) == fake.requests[0].response["content"]
    # The journal carries it encoded; decoded, the deltas are the text and the complete the result.
    journal = decoded_events(db, run_id)
    assert "".join(e["text"] for e in journal if e["type"] == "text_delta") == NUL_TEXT
    assert "\x00" in "".join(e["thinking"] for e in journal if e["type"] == "thinking_delta")
    assert journal[-1]["type"] == "complete" and journal[-1]["result"]["text"] == NUL_TEXT
    encoded = [e for e in events(db, run_id) if e["type"] == "text_delta"]
    assert all(e.get("_encoding") == "nul-percent" for e in encoded if "%00" in e["text"])
    # `runrow tail` prints the answer with its NUL.
    tailed = subprocess.run(
        [sys.executable, "-m", "pyworker", "--database-url", worker_db, "tail", str(run_id)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert tailed.returncode == 0, tailed.stderr
    assert tailed.stdout == NUL_TEXT  # piped: exactly the answer, no newline added

    # The next turn's request carries the turn back byte-identically: the fake verifies the
    # thinking block's signature over the history and answers 400 if anything changed.
    second = enqueue_agent(db, "And again?", conversation_id=conversation_id, metadata=THINKING)
    assert wait_status(db, second, TERMINAL, 30) == "completed", (run_row(db, second), worker.log())
    assert fake.request_count == 2
    resent = undecorated(fake.requests[1].body["messages"][1])
    assert resent == {"role": "assistant", "content": fake.requests[0].response["content"]}


def test_a_nul_in_a_tool_input_fails_the_run_once_after_one_model_call(
    db: psycopg.Connection, fake: FakeModel, worker: WorkerProcess, tmp_path: Path
) -> None:
    fake.set_scenario("nul_tool_input")
    run_id = enqueue_agent(db, "Read the notes.", max_attempts=3, metadata={})
    assert wait_status(db, run_id, TERMINAL, 30) == "failed", (run_row(db, run_id), worker.log())
    row = run_row(db, run_id)
    assert fake.request_count == 1, "the refusal recurs on every attempt: no second model call"
    assert row["attempt"] == 1
    assert "read_file" in row["error"] and "input cannot be recorded" in row["error"], row["error"]
    assert "22P05" in row["error"], row["error"]
    # The model's turn is in the step log as produced; the tool never ran.
    [(_, kind, payload)] = steps(db, run_id)
    assert kind == "model_turn" and "\\u0000" in payload
    assert not [r for r in demo_tools.records(tmp_path) if r.tool == "read_file"]
    complete = [e for e in events(db, run_id) if e["type"] == "complete"]
    assert [(e["status"], e["error"]) for e in complete] == [("failed", row["error"])]


def test_over_http_the_result_is_decoded_and_the_stream_relays_the_journal_as_stored(
    worker_db: str, db: psycopg.Connection, fake: FakeModel, worker: WorkerProcess
) -> None:
    fake.set_scenario("nul_text")
    for server in serve(worker_db, model="claude-fake-1"):
        with httpx.Client(base_url=server.url, timeout=20) as client:
            posted = client.post(
                f"/conversations/{uuid.uuid4()}/runs", json={"content": "odd?"}, headers=ALICE
            )
            assert posted.status_code == 202, posted.text
            run_id = uuid.UUID(posted.json()["run_id"])
            assert wait_status(db, run_id, TERMINAL, 30) == "completed", worker.log()
            state = client.get(f"/runs/{run_id}", headers=ALICE).json()
            assert state["result"] == {"text": NUL_TEXT, "stop_reason": "end_turn"}
            stream = read_stream(client, run_id, ALICE)
    assert [{"seq": f.id, **f.data} for f in stream.events] == events(db, run_id)  # as stored
    assert (
        "".join(nul.decode(f.data).get("text", "") for f in stream.events if f.event == "text_delta")
        == NUL_TEXT
    )
