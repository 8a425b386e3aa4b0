"""The two crash paths that are not a clean SIGKILL-and-resume:

- A zombie: a worker frozen (SIGSTOP) in the middle of a non-idempotent tool loses its lease;
  another worker resumes the run, re-runs the tool with the same idempotency key (the downstream
  service dedups it) and finishes. Thawed, the zombie writes nothing: no step, no event, no result.
- An uncertain intent: an approved irreversible tool is killed mid-execution. The resumed attempt
  does not run it again: the run parks as waiting with reason `uncertain`, `runrow approvals` lists
  it, and a person's "no, it happened" reaches the model as a rejected call.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import psycopg
from agent_support import QUICK_TAKEOVER, ForkedWorker, agent_env, enqueue_agent, steps
from worker_support import db, events, run_row, wait_status, wait_until, worker_db

from pyworker.cli.main import main as cli
from pyworker.demo import tools as demo_tools
from pyworker.fake.scenarios import DEMO_TOOLS, ModelRequest, Text, ToolCall, Turn, script, turn
from pyworker.fake.server import FakeModel

__all__ = ["db", "worker_db"]

TERMINAL = {"completed", "failed", "dead", "cancelled"}
DELETE = demo_tools.definitions(["delete_file"])


def executions(demo_dir: Path, tool: str) -> int:
    """How often the tool's body ran (pyworker/demo/tools.py's downstream record); 0 before."""
    return demo_tools.execution_counts(demo_dir)[tool]


def effect_rows(demo_dir: Path, tool: str) -> int:
    """Distinct keys of the tool downstream: effects that happened."""
    return sum(1 for e in demo_tools.records(demo_dir) if e.tool == tool)


def snapshot(conn: psycopg.Connection, run: uuid.UUID) -> tuple[Any, ...]:
    effects = conn.execute(
        "SELECT idempotency_key, state, result::text, started_attempt FROM runrow.tool_effect "
        "WHERE run_id = %s ORDER BY idempotency_key",
        (run,),
    ).fetchall()
    return steps(conn, run), events(conn, run), effects, run_row(conn, run)


def test_a_thawed_zombie_writes_nothing_after_another_worker_finished_its_run(
    db, worker_db, tmp_path
) -> None:
    with FakeModel("demo") as fake:
        env = agent_env(fake.base_url, tmp_path, tool_delay="1.0")
        zombie = ForkedWorker(worker_db, "zombie", env, **QUICK_TAKEOVER)
        rescuer: ForkedWorker | None = None
        try:
            run = enqueue_agent(db, max_attempts=3)
            wait_until(lambda: executions(tmp_path, "send_email") == 1, 30, "the email to be sent")
            os.kill(zombie.pid, signal.SIGSTOP)  # frozen inside send_email, before its result
            assert len(steps(db, run)) == 6
            rescuer = ForkedWorker(worker_db, "rescuer", agent_env(fake.base_url, tmp_path), **QUICK_TAKEOVER)
            assert wait_status(db, run, TERMINAL, 30) == "completed"
            before = snapshot(db, run)
            os.kill(zombie.pid, signal.SIGCONT)
            os.kill(zombie.pid, signal.SIGTERM)  # once it has exited, nothing more can come from it
            zombie.proc.join(30)
            assert zombie.proc.exitcode == 0
            assert snapshot(db, run) == before
        finally:
            zombie.kill()
            if rescuer is not None:
                rescuer.kill()
    row = run_row(db, run)
    assert (row["attempt"], row["worker_id"]) == (2, "rescuer")
    assert effect_rows(tmp_path, "send_email") == 1  # one email downstream
    assert executions(tmp_path, "send_email") == 2  # the rescuer re-sent it with the same key
    [email_result] = [
        json.loads(p) for _, kind, p in steps(db, run) if kind == "tool_result" and "message_id" in p
    ]
    assert email_result["is_error"] is False


def delete_scenario() -> Any:
    def summary(request: ModelRequest) -> Turn:
        [result] = request.tool_results
        return turn(Text(f"The delete came back: is_error={result.get('is_error')}: {result.get('content')}"))

    return script(
        turn(Text("Deleting the todo list."), ToolCall("delete_file", {"path": "notes/todo.txt"})), summary
    )


def test_an_approved_irreversible_call_cut_by_a_crash_waits_for_a_person(
    db, worker_db, tmp_path, capsys
) -> None:
    with FakeModel(delete_scenario()) as fake:
        env = agent_env(fake.base_url, tmp_path, tool_delay="1.0")
        first = ForkedWorker(worker_db, "first", env, **QUICK_TAKEOVER)
        second: ForkedWorker | None = None
        try:
            run = enqueue_agent(db, "Clean up.", tools=[*DEMO_TOOLS, *DELETE], metadata={}, max_attempts=3)
            wait_status(db, run, "waiting", 30)
            [(key, reason)] = db.execute(
                "SELECT idempotency_key, reason FROM runrow.pending_approvals WHERE run_id = %s", (run,)
            ).fetchall()
            assert reason == "needs_approval" and executions(tmp_path, "delete_file") == 0
            assert cli(["--database-url", worker_db, "approve", key, "--by", "alice"]) == 0
            wait_until(lambda: executions(tmp_path, "delete_file") == 1, 30, "the delete to happen")
            first.kill()  # mid-effect: the file is gone, the result is not recorded
            assert not (demo_tools.workspace(tmp_path) / "notes" / "todo.txt").exists()

            second = ForkedWorker(worker_db, "second", env, **QUICK_TAKEOVER)
            wait_status(db, run, "waiting", 30)
            [(again, reason, approved_before)] = db.execute(
                "SELECT idempotency_key, reason, previously_approved FROM runrow.pending_approvals "
                "WHERE run_id = %s",
                (run,),
            ).fetchall()
            assert (again, reason, approved_before) == (key, "uncertain", True)
            assert executions(tmp_path, "delete_file") == 1  # not run again without a person
            capsys.readouterr()
            assert cli(["--database-url", worker_db, "approvals"]) == 0
            listing = capsys.readouterr().out
            assert key in listing and "uncertain" in listing and "may have happened" in listing
            note = "It did happen: the file is gone."
            assert cli(["--database-url", worker_db, "reject", key, "--by", "bob", "--note", note]) == 0
            assert wait_status(db, run, TERMINAL, 30) == "completed"
        finally:
            first.kill()
            if second is not None:
                second.kill()
    assert executions(tmp_path, "delete_file") == 1
    [result] = [json.loads(p) for _, kind, p in steps(db, run) if kind == "tool_result"]
    assert result["is_error"] is True and note in result["content"] and "bob" in result["content"]
    assert note in run_row(db, run)["result"]["text"]  # the model was told
    decisions = [e for e in events(db, run) if e["type"] == "approval_resolved"]
    assert [(d["decided_by"], d["approved"], d["reason"]) for d in decisions] == [
        ("alice", True, "needs_approval"),
        ("bob", False, "uncertain"),
    ]
    assert len(fake.requests) == 2
