"""Fork and replay of a recorded demo run (issue 15), with the real SDK against the fake Messages API,
which checks every thinking signature against the model, system prompt, tools and exact history
before it, as the real API does.

- `runrow replay` re-asks each model turn and executes no tool (the demo tools count their
  executions downstream); it prints the recorded and the new answer side by side with tokens.
  Under the recorded model the history is served as stored and every signature verifies; under
  another model the thinking is left out and the fake takes every request.
- `runrow fork` copies the step log byte for byte: the fork's agent_step rows are the source's,
  a worker resumes it and the API accepts the copied thinking, and only the tools after the fork
  point run again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from agent_support import ForkedWorker, agent_env, enqueue_agent, steps
from worker_support import db, wait_status, worker_db

from pyworker.cli.main import main as cli
from pyworker.demo import tools as demo_tools
from pyworker.fake.server import FakeModel

__all__ = ["db", "worker_db"]

TERMINAL = {"completed", "failed", "cancelled", "dead"}
DEMO_MODEL_TURNS = 6


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel("demo") as server:
        yield server


@pytest.fixture
def demo_run(
    db: psycopg.Connection, worker_db: str, fake: FakeModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[uuid.UUID, ForkedWorker]]:
    """A finished demo run, and the worker (still running) that ran it."""
    env = agent_env(fake.base_url, tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    worker = ForkedWorker(worker_db, "a", env, poll_seconds=0.3, concurrency=1)
    try:
        run = enqueue_agent(db)
        assert wait_status(db, run, TERMINAL, 60) == "completed"
        yield run, worker
    finally:
        worker.stop()


def step_rows(db: psycopg.Connection, run: uuid.UUID) -> list[tuple[object, ...]]:
    return db.execute(
        "SELECT seq, kind, payload::text, request_id, attempt, usage, stop_reason, tool_use_id "
        "FROM runrow.agent_step WHERE run_id = %s ORDER BY seq",
        (run,),
    ).fetchall()


def replay(worker_db: str, run: uuid.UUID, *args: str) -> int:
    return cli(["--database-url", worker_db, "replay", str(run), "--width", "200", *args])


def test_replay_executes_no_tool_and_prints_both_columns(
    db, worker_db, fake, demo_run, tmp_path, capsys
) -> None:
    run, _ = demo_run
    executed = demo_tools.execution_counts(tmp_path)
    assert sum(executed.values()) == 6  # list, read x2, email, write, read
    logged = steps(db, run)
    effects = db.execute("SELECT count(*) FROM runrow.tool_effect").fetchone()
    asked = len(fake.requests)
    capsys.readouterr()

    assert replay(worker_db, run, "--model", "claude-fake-2") == 0
    out = capsys.readouterr().out

    assert demo_tools.execution_counts(tmp_path) == executed  # not one tool body ran
    assert (
        steps(db, run) == logged
        and db.execute("SELECT count(*) FROM runrow.tool_effect").fetchone() == effects
    )
    requests = fake.requests[asked:]
    assert len(requests) == DEMO_MODEL_TURNS
    assert all(r.status == 200 and r.outcome == "ok" for r in requests)
    assert {r.body["model"] for r in requests} == {"claude-fake-2"}
    for r in requests:  # thinking signed for claude-fake-1 is not sent to claude-fake-2
        for message in r.body["messages"]:
            if message["role"] == "assistant":
                assert all(b["type"] not in ("thinking", "redacted_thinking") for b in message["content"])
    # The recorded tool results are what each turn is asked with.
    last = requests[-1].body["messages"][-1]["content"]
    recorded = [json.loads(text) for _, kind, text in logged if kind == "tool_result"][-1]
    assert last == [recorded]

    lines = out.splitlines()
    assert f"replay of run {run}: {DEMO_MODEL_TURNS} model turns" in lines[0]
    headers = [line for line in lines if line.startswith("claude-fake-1  in ")]
    assert len(headers) == DEMO_MODEL_TURNS
    assert all(" | claude-fake-2  in " in h and " out " in h.split(" | ")[1] for h in headers)
    # The fake is scripted by position, so both columns hold the same answer, on the same line.
    assert (
        "I'll start by listing the workspace.".ljust(98) + " | I'll start by listing the workspace." in lines
    )
    assert any(
        line.startswith('-> list_files {"path": "."}') and line.endswith('| -> list_files {"path": "."}')
        for line in lines
    )
    total = [line for line in lines if line.startswith("recorded  in ")]
    assert len(total) == 1 and "| replay  in " in total[0]


def test_replay_under_the_recorded_model_sends_the_history_as_stored(
    db, worker_db, fake, demo_run, tmp_path, capsys
) -> None:
    run, _ = demo_run
    executed = demo_tools.execution_counts(tmp_path)
    asked = len(fake.requests)
    system = tmp_path / "system.txt"
    system.write_text("You are a careful assistant. Use the tools.")  # the recorded prompt, from a file

    assert replay(worker_db, run, "--system-file", str(system)) == 0

    requests = fake.requests[asked:]
    assert len(requests) == DEMO_MODEL_TURNS
    # Thinking stays on and every recorded signature verifies: the step log's bytes went back as stored.
    assert all(r.status == 200 and r.outcome == "ok" and r.body.get("thinking") for r in requests)
    assert requests[-1].body["messages"][-2]["content"][0]["type"] == "thinking"
    assert demo_tools.execution_counts(tmp_path) == executed
    assert "thinking off" not in capsys.readouterr().out


def test_replay_bad_input_is_one_line_and_exit_2(db, worker_db, fake, demo_run, tmp_path, capsys) -> None:
    run, worker = demo_run
    capsys.readouterr()
    assert replay(worker_db, uuid.UUID(int=0)) == 2
    assert capsys.readouterr().err.strip() == f"runrow: run {uuid.UUID(int=0)} does not exist"
    assert replay(worker_db, run, "--system-file", str(tmp_path / "missing.txt")) == 2
    assert "cannot read --system-file" in capsys.readouterr().err
    worker.stop()
    queued = enqueue_agent(db, "not yet run")
    assert replay(worker_db, queued) == 2
    assert capsys.readouterr().err.strip() == f"runrow: run {queued} is queued: replay needs a finished run"
    db.execute("SELECT runrow.cancel_run(%s)", (queued,))
    assert replay(worker_db, queued) == 2
    assert "has no model turn to replay" in capsys.readouterr().err


def test_fork_keeps_the_step_log_bytes_and_resumes_from_the_fork_point(
    db, worker_db, fake, demo_run, tmp_path, capsys
) -> None:
    run, _ = demo_run
    source = step_rows(db, run)
    assert [r[1] for r in source[5:7]] == ["model_turn", "tool_result"]  # step 6 sent the email, 7 its result
    executed = demo_tools.execution_counts(tmp_path)
    asked = len(fake.requests)
    capsys.readouterr()

    assert cli(["--database-url", worker_db, "fork", str(run), "7"]) == 0
    fork = uuid.UUID(capsys.readouterr().out.split()[0])
    assert step_rows(db, fork) == source[:7]  # every copied row verbatim: payload bytes, usage, request ids
    assert wait_status(db, fork, TERMINAL, 60) == "completed"

    rows = step_rows(db, fork)
    assert rows[:7] == source[:7] and len(rows) == len(source)
    requests = fake.requests[asked:]
    # The worker resumed at step 8 and the API accepted the copied, signed thinking as it stood.
    assert len(requests) == 3 and all(r.status == 200 and r.outcome == "ok" for r in requests)
    ran = demo_tools.execution_counts(tmp_path) - executed
    assert ran == {"write_file": 1, "read_file": 1}  # the email of step 6 was not sent again
    conversation = db.execute(
        "SELECT conversation_id, forked_from, forked_at_seq FROM runrow.agent_run WHERE id = %s", (fork,)
    ).fetchone()
    assert conversation[1:] == (run, 7)
    assert (
        conversation[0]
        != db.execute("SELECT conversation_id FROM runrow.agent_run WHERE id = %s", (run,)).fetchone()[0]
    )


def test_fork_to_another_model_says_which_blocks_to_drop(db, worker_db, demo_run, capsys) -> None:
    run, worker = demo_run
    worker.stop()  # the fork stays queued: this test reads what fork_run answers
    capsys.readouterr()
    assert cli(["--database-url", worker_db, "fork", str(run), "3", "--model", "claude-fake-2"]) == 0
    out = capsys.readouterr().out.splitlines()
    must_drop = json.loads(out[1])["must_drop"]
    fork = uuid.UUID(out[0])
    assert [(d["run_id"], d["seq"], d["index"], d["type"]) for d in must_drop] == [
        (str(fork), 1, 0, "thinking"),
        (str(fork), 3, 0, "thinking"),
    ]
    assert cli(["--database-url", worker_db, "fork", str(run), "99"]) == 2
    assert "at_seq must be between 0 and 12" in capsys.readouterr().err
