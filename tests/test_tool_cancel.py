"""A stop while a tool runs (pyworker/agent/tools.py, "Cooperative cancellation"; README "Cancel").

A tool that takes `cancel` is told and the run ends cancelled without waiting for the tool's own
end; an async pure tool without it is cancelled at once; any other tool is awaited. A call cut
short keeps its effect class honest: a pure one gets a "cancelled" error result, a non_idempotent
one is uncertain, and a later attempt of the run parks on it instead of running it again.

The in-process worker runs the agent loop with the real SDK against the fake Messages API; the
drain test uses real worker processes and SIGTERM. The tools here would take minutes on their own:
a run that is not stopped promptly does not end within the test's deadline.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from agent_support import (
    InProcessWorker,
    agent_worker,
    enqueue_agent,
    fake,
    module_conn,
    module_db,
    steps,
)
from worker_support import WorkerProcess, events, run_row, wait_status, wait_until, worker_db

from pyworker.agent.tool_calls import STOPPED_RESULT
from pyworker.agent.tools import ToolCancelled, ToolRegistry, tool
from pyworker.cli.main import main as cli
from pyworker.demo import tools as demo_tools
from pyworker.fake.scenarios import ModelRequest, Text, ToolCall, script, turn
from pyworker.fake.server import FakeModel

__all__ = ["fake", "module_conn", "module_db", "worker_db"]

TERMINAL = {"completed", "failed", "cancelled", "dead"}
LONG = 300.0  # what a tool takes when nobody stops it: far beyond every deadline below
JOB = {"type": "object", "properties": {"job": {"type": "string"}}, "required": ["job"]}
registry = ToolRegistry()
seen: dict[str, list[str]] = defaultdict(list)  # tool -> what happened inside it, in order
gate = threading.Event()  # lets a tool that waits on it finish


def _definition(name: str) -> dict[str, Any]:
    t = registry.get(name)
    assert t is not None
    return t.definition()


@tool(input_schema=JOB, description="Wait for a job (cooperative).", effect="pure", into=registry)
async def wait_for_job(job: str, cancel: asyncio.Event | None = None) -> str:
    seen["wait_for_job"].append("started")
    if cancel is None:  # a worker that hands out no signal: the job takes its time
        await asyncio.sleep(LONG)
        return "job done"
    try:
        await asyncio.wait_for(cancel.wait(), LONG)
    except TimeoutError:
        return "job done"
    seen["wait_for_job"].append("told")
    raise ToolCancelled("stopped before the job was done")


@tool(input_schema=JOB, description="Wait for a job (cooperative, sync).", effect="pure", into=registry)
def wait_for_job_sync(job: str, cancel: threading.Event | None = None) -> str:
    seen["wait_for_job_sync"].append("started")
    if not (cancel or threading.Event()).wait(LONG):
        return "job done"
    seen["wait_for_job_sync"].append("told")
    raise ToolCancelled("stopped before the job was done")


@tool(input_schema=JOB, description="Move money (cooperative).", effect="non_idempotent", into=registry)
async def transfer(job: str, idempotency_key: str, cancel: asyncio.Event | None = None) -> str:
    seen["transfer"].append(f"started {idempotency_key}")  # the money starts moving downstream
    if cancel is None:
        await asyncio.sleep(LONG)
        return "transferred"
    try:
        await asyncio.wait_for(cancel.wait(), LONG)
    except TimeoutError:
        return "transferred"
    seen["transfer"].append("told")
    raise ToolCancelled("stopped half-way through the transfer")


@tool(
    input_schema=JOB,
    description="Move money (takes the signal, ignores it).",
    effect="non_idempotent",
    into=registry,
    cancel_grace=0.5,
)
async def stubborn_transfer(job: str, idempotency_key: str, cancel: asyncio.Event | None = None) -> str:
    seen["stubborn_transfer"].append(f"started {idempotency_key}")
    try:
        await asyncio.sleep(LONG)
    except asyncio.CancelledError:
        seen["stubborn_transfer"].append("cancelled")
        raise
    return "transferred"


@tool(input_schema=JOB, description="Fetch a page (no signal).", effect="pure", into=registry)
async def fetch_page(job: str) -> str:
    seen["fetch_page"].append("started")
    try:
        await asyncio.sleep(LONG)
    except asyncio.CancelledError:
        seen["fetch_page"].append("cancelled")
        raise
    return "page"


@tool(input_schema=JOB, description="Charge a card (no signal).", effect="non_idempotent", into=registry)
async def charge(job: str, idempotency_key: str) -> str:
    seen["charge"].append("started")
    await asyncio.to_thread(gate.wait, 60)  # the test's thread opens the gate
    seen["charge"].append("finished")
    return "charged"


def summary(request: ModelRequest) -> Any:
    return turn(Text("Results: " + "; ".join(str(r.get("content")) for r in request.tool_results)))


def calling(name: str) -> Any:
    return script(turn(Text(f"Calling {name}."), ToolCall(name, {"job": "j1"})), summary)


@pytest.fixture(scope="module")
def worker(module_db: str, fake: FakeModel) -> Iterator[InProcessWorker]:
    config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "test-key", "registry": registry}
    with InProcessWorker(module_db, "tool-cancel", config=config, lease_seconds=2, drain_seconds=1) as w:
        yield w


@pytest.fixture
def db(module_conn: psycopg.Connection, fake: FakeModel, worker: InProcessWorker) -> psycopg.Connection:
    fake.reset()
    seen.clear()
    gate.clear()
    return module_conn


def start(db: psycopg.Connection, fake: FakeModel, name: str) -> tuple[uuid.UUID, uuid.UUID]:
    """Enqueue a run whose model calls `name`; return (conversation, run) once the tool runs."""
    fake.set_scenario(calling(name))
    conversation = uuid.uuid4()
    run = enqueue_agent(db, "Go.", conversation_id=conversation, tools=[_definition(name)], metadata={})
    wait_until(lambda: seen[name], 15, f"{name} to start")
    return conversation, run


def stop(module_db: str, conversation: uuid.UUID) -> None:
    assert cli(["--database-url", module_db, "stop", str(conversation)]) == 0


def effect(db: psycopg.Connection, run: uuid.UUID) -> dict[str, Any]:
    cur = db.execute(
        "SELECT e.state, e.result, e.is_error, o.attention, o.may_have_happened "
        "FROM runrow.tool_effect AS e LEFT JOIN runrow.open_tool_effects AS o USING (idempotency_key) "
        "WHERE e.run_id = %s",
        (run,),
    )
    [row] = cur.fetchall()
    return dict(zip([d.name for d in cur.description or ()], row, strict=True))


def kinds(db: psycopg.Connection, run: uuid.UUID) -> list[str]:
    return [kind for _, kind, _ in steps(db, run)]


def interruptions(db: psycopg.Connection, run: uuid.UUID) -> list[tuple[str, str]]:
    return [
        (e["state"], e["reason"].split(":")[0]) for e in events(db, run) if e["type"] == "tool_interrupted"
    ]


@pytest.mark.parametrize("name", ["wait_for_job", "wait_for_job_sync"])
def test_stop_tells_a_cooperative_tool_and_the_run_ends_cancelled(db, fake, module_db, name) -> None:
    conversation, run = start(db, fake, name)
    stop(module_db, conversation)
    assert wait_status(db, run, TERMINAL, timeout=20) == "cancelled"
    assert seen[name] == ["started", "told"]  # the tool got the signal and stopped on it
    assert run_row(db, run)["result"]["stop_reason"] == "cancelled"
    # A pure call cut short is recorded as cancelled: the model of a later turn reads why.
    assert effect(db, run) == {
        "state": "done",
        "result": STOPPED_RESULT,
        "is_error": True,
        "attention": None,
        "may_have_happened": None,
    }
    assert kinds(db, run) == ["model_turn", "tool_result"]
    assert interruptions(db, run) == [("executing", "stopped")]
    assert len(fake.requests) == 1  # and no model call after the stop
    assert [e["type"] for e in events(db, run)][-1] == "complete"


@pytest.mark.parametrize("name", ["transfer", "stubborn_transfer"])
def test_a_non_idempotent_tool_cut_short_is_uncertain(db, fake, module_db, name) -> None:
    conversation, run = start(db, fake, name)
    stop(module_db, conversation)
    assert wait_status(db, run, TERMINAL, timeout=20) == "cancelled"
    # Told and stopped part-way, or ignored the signal past its cancel_grace and was cancelled.
    assert seen[name][1:] == (["told"] if name == "transfer" else ["cancelled"])
    assert effect(db, run) == {
        "state": "uncertain",
        "result": None,
        "is_error": None,
        "attention": "abandoned",
        "may_have_happened": True,
    }
    assert kinds(db, run) == ["model_turn"]  # no result was made up for it
    assert interruptions(db, run) == [("uncertain", "stopped")]
    assert len([s for s in seen[name] if s.startswith("started")]) == 1


def test_an_async_pure_tool_without_the_signal_is_cancelled_at_once(db, fake, module_db) -> None:
    conversation, run = start(db, fake, "fetch_page")
    stop(module_db, conversation)
    assert wait_status(db, run, TERMINAL, timeout=20) == "cancelled"
    assert seen["fetch_page"] == ["started", "cancelled"]
    assert effect(db, run)["state"] == "done" and effect(db, run)["result"] == STOPPED_RESULT


def test_a_non_idempotent_tool_without_the_signal_is_awaited_and_its_result_kept(
    db, fake, module_db, worker
) -> None:
    conversation, run = start(db, fake, "charge")
    stop(module_db, conversation)
    assert worker.worker.dispatcher is not None
    dispatcher = worker.worker.dispatcher
    wait_until(
        lambda: any(sup.cancel.is_set() for sup in dispatcher.supervisors(run)),
        10,
        "the worker to see the stop",
    )
    assert run_row(db, run)["status"] == "running"  # the stop waits for the charge
    gate.set()
    assert wait_status(db, run, TERMINAL, timeout=20) == "cancelled"
    assert seen["charge"] == ["started", "finished"]
    assert effect(db, run)["state"] == "done" and effect(db, run)["result"] == "charged"
    assert kinds(db, run) == ["model_turn", "tool_result"]
    assert interruptions(db, run) == []
    assert len(fake.requests) == 1


def test_a_drained_non_idempotent_tool_is_uncertain_and_the_next_attempt_parks_on_it(
    worker_db: str, fake: FakeModel, tmp_path: Path
) -> None:
    """Real processes: worker A is SIGTERMed while send_email runs (its effect done, its result not
    yet recorded) and drains past its budget; the requeued run's next attempt, on worker B, must
    not send again: it parks on the uncertain call, and a person's rejection settles it."""
    fake.reset()
    email = {"to": "team@example.com", "subject": "status", "body": "all good"}
    fake.set_scenario(script(turn(Text("Sending."), ToolCall("send_email", email)), summary))
    started: list[WorkerProcess] = []
    with psycopg.connect(worker_db, autocommit=True) as db:
        try:
            # The tool sleeps after its effect (RUNROW_DEMO_TOOL_DELAY): SIGTERM lands inside it.
            a = agent_worker(
                worker_db, "drain-a", fake.base_url, tmp_path, "--drain", "0.5", tool_delay="120"
            )
            started.append(a)
            a.wait_started()
            run = enqueue_agent(db, "Send it.", tools=demo_tools.definitions(["send_email"]), metadata={})
            wait_until(lambda: demo_tools.execution_counts(tmp_path)["send_email"], 30, "the email to go out")
            a.signal(signal.SIGTERM)
            wait_until(lambda: run_row(db, run)["status"] == "queued", 20, "worker A to release the run")
            assert effect(db, run)["state"] == "uncertain"
            assert interruptions(db, run) == [("uncertain", "drained")]

            b = agent_worker(worker_db, "resume-b", fake.base_url, tmp_path)
            started.append(b)
            assert wait_status(db, run, {"waiting", *TERMINAL}, timeout=30) == "waiting"
            assert demo_tools.execution_counts(tmp_path)["send_email"] == 1  # never sent twice
            [(key, reason, attempt)] = db.execute(
                "SELECT p.idempotency_key, p.reason, r.attempt FROM runrow.pending_approvals AS p "
                "JOIN runrow.agent_run AS r ON r.id = p.run_id WHERE p.run_id = %s",
                (run,),
            ).fetchall()
            assert reason == "uncertain" and attempt == 1  # parking handed attempt 2 back

            assert (
                cli(["--database-url", worker_db, "reject", key, "--by", "ops", "--note", "it went out"]) == 0
            )
            assert wait_status(db, run, TERMINAL, timeout=30) == "completed"
            assert demo_tools.execution_counts(tmp_path)["send_email"] == 1
            [result] = [p for _, kind, p in steps(db, run) if kind == "tool_result"]
            assert '"is_error":true' in result and "it went out" in result
        finally:
            for w in started:
                w.close()  # A's tool thread still sleeps, so A cannot exit by itself yet
