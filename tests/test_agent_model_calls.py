"""How many model calls a run makes, with the real SDK against the fake Messages API (which
honours tool_choice as the API does) and a real worker.

- A forcing `tool_choice` pinned in a run's metadata (`any`, `tool`) makes the model call a tool on
  every request it is sent with. It was sent with every request of the loop, so the model could
  never answer: the run went on without end (194 requests in 8 s in the audit), each request
  carrying the whole growing history. It is sent only on the request that answers the person's
  message; the requests after tool results say `auto` (keeping `disable_parallel_tool_use`), and a
  resumed attempt decides the same from the history it sends.
- `max_model_calls` (worker config, `runrow worker --max-model-calls`): a run that has made that
  many model calls and would go on ends `failed` once, counted from the step log across attempts.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from agent_support import InProcessWorker, enqueue_agent, module_conn, module_db, steps, undecorated
from worker_support import run_row, wait_status

from pyworker.agent.tools import ToolRegistry, tool
from pyworker.fake.faults import drop_connection
from pyworker.fake.scenarios import ModelRequest, Text, ToolCall, turn
from pyworker.fake.server import FakeModel

__all__ = ["module_conn", "module_db"]

TERMINAL = {"completed", "failed", "cancelled", "dead"}
CAP = 3
WEATHER = {
    "name": "get_weather",
    "description": "Weather of a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME = {
    "name": "get_time",
    "description": "Time in a timezone.",
    "input_schema": {"type": "object", "properties": {"timezone": {"type": "string"}}},
}

registry = ToolRegistry()
calls: list[str] = []


@tool(input_schema=WEATHER["input_schema"], description="Weather.", effect="non_idempotent", into=registry)
def get_weather(city: str, idempotency_key: str) -> dict[str, Any]:
    calls.append(city)
    return {"city": city, "sky": "sunny"}


@tool(input_schema=TIME["input_schema"], description="Time.", effect="pure", into=registry)
def get_time(timezone: str = "UTC") -> str:
    calls.append(timezone)
    return "12:00"


def answers_after_the_weather(request: ModelRequest) -> Any:
    """A model that answers once it has the weather (the fake makes its answer a tool call
    whenever the request's tool_choice forces one, as the API does)."""
    if request.tool_results:
        return turn(Text("Sunny in Paris."))
    return turn(Text("Let me look."), ToolCall("get_weather", {"city": "Paris"}))


def never_answers(request: ModelRequest) -> Any:
    """A model that calls a tool on every request, whatever the tool_choice."""
    return turn(ToolCall("get_weather", {"city": f"Paris{len(request.messages)}"}))


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModel]:
    with FakeModel(answers_after_the_weather) as server:
        yield server


@pytest.fixture(scope="module")
def worker(module_db: str, fake: FakeModel) -> Iterator[InProcessWorker]:
    config = {
        "anthropic_base_url": fake.base_url,
        "anthropic_api_key": "test-key",
        "registry": registry,
        "max_model_calls": CAP,
    }
    with InProcessWorker(module_db, "model-calls", config=config, lease_seconds=2, concurrency=2) as w:
        yield w


@pytest.fixture
def db(module_conn: psycopg.Connection, fake: FakeModel, worker: InProcessWorker) -> psycopg.Connection:
    fake.reset()
    fake.set_scenario(answers_after_the_weather)
    calls.clear()
    return module_conn


def finish(db: psycopg.Connection, run: uuid.UUID, timeout: float = 20) -> dict[str, Any]:
    """The run's row once it ended; a run still going after `timeout` is cancelled (so that it
    does not hold the worker's slot for the next test) and the test fails."""
    try:
        wait_status(db, run, TERMINAL, timeout)
    except AssertionError:
        db.execute("SELECT runrow.cancel_run(run_id => %s)", (run,))
        wait_status(db, run, TERMINAL, 15)
        raise
    return run_row(db, run)


def tool_choices(fake: FakeModel) -> list[Any]:
    return [undecorated(r.body).get("tool_choice") for r in fake.requests]


def kinds(db: psycopg.Connection, run: uuid.UUID) -> list[str]:
    return [kind for _, kind, _ in steps(db, run)]


@pytest.mark.parametrize(
    ("pinned", "after"),
    [
        ({"type": "any"}, {"type": "auto"}),
        (
            {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            {"type": "auto", "disable_parallel_tool_use": True},
        ),
    ],
    ids=["any", "tool-without-parallel-calls"],
)
def test_a_forcing_tool_choice_is_sent_only_with_the_persons_message(db, fake, pinned, after) -> None:
    run = enqueue_agent(db, "Weather?", system=None, tools=[WEATHER, TIME], metadata={"tool_choice": pinned})
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 1), (row, len(fake.requests))
    assert row["result"] == {"text": "Sunny in Paris.", "stop_reason": "end_turn"}
    assert tool_choices(fake) == [pinned, after]
    assert calls == ["Paris"]
    assert kinds(db, run) == ["model_turn", "tool_result", "model_turn"]


def test_a_forced_tool_call_is_made_even_when_the_model_would_answer(db, fake) -> None:
    """The fake as the API: forced, the first answer is a tool call whatever the model would say."""
    fake.set_scenario(
        lambda request: turn(Text("It is sunny.")) if not request.tool_results else turn(Text("ok"))
    )
    pinned = {"type": "tool", "name": "get_time"}
    run = enqueue_agent(db, "Time?", system=None, tools=[WEATHER, TIME], metadata={"tool_choice": pinned})
    row = finish(db, run)
    assert (row["status"], row["result"]["text"]) == ("completed", "ok"), row
    assert [r.response["stop_reason"] for r in fake.requests] == ["tool_use", "end_turn"]
    assert [b["name"] for b in fake.requests[0].response["content"]] == ["get_time"]
    assert tool_choices(fake) == [pinned, {"type": "auto"}]


def test_a_resumed_attempt_sends_auto_after_the_tool_results(db, fake) -> None:
    """The attempt that asks after the tool results is a new one (the request with the results
    was cut): it decides from the history it sends, not from what an earlier attempt did."""
    fake.inject(None, drop_connection(after_events=2))
    run = enqueue_agent(
        db,
        "Weather?",
        system=None,
        tools=[WEATHER],
        metadata={"tool_choice": {"type": "any"}},
        max_attempts=2,
    )
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 2), (row, len(fake.requests))
    assert [r.outcome for r in fake.requests] == ["ok", "dropped", "ok"]
    assert tool_choices(fake) == [{"type": "any"}, {"type": "auto"}, {"type": "auto"}]
    assert calls == ["Paris"]


def test_the_next_message_of_the_conversation_is_forced_again(db, fake) -> None:
    """Each person's message starts a turn: the pinned choice applies to its first request."""
    pinned = {"type": "any"}
    first = enqueue_agent(db, "Weather?", system=None, tools=[WEATHER], metadata={"tool_choice": pinned})
    assert finish(db, first)["status"] == "completed"
    conversation = db.execute(
        "SELECT conversation_id FROM runrow.agent_run WHERE id = %s", (first,)
    ).fetchone()[0]
    second = enqueue_agent(
        db,
        "And now?",
        conversation_id=conversation,
        system=None,
        tools=[WEATHER],
        metadata={"tool_choice": pinned},
    )
    assert finish(db, second)["status"] == "completed"
    assert tool_choices(fake) == [pinned, {"type": "auto"}, pinned, {"type": "auto"}]


def test_a_run_at_its_model_call_cap_fails_once(db, fake) -> None:
    fake.set_scenario(never_answers)
    run = enqueue_agent(db, "Weather?", system=None, tools=[WEATHER], metadata={}, max_attempts=3)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("failed", 1), row
    assert row["error"].startswith(f"max_model_calls: the run made {CAP} model calls"), row["error"]
    assert "--max-model-calls" in row["error"]
    assert row["result"] == {"text": "", "stop_reason": "max_model_calls"}
    assert len(fake.requests) == CAP
    # The last turn's tool call is not run: no model call may follow to read its result.
    assert len(calls) == CAP - 1
    assert kinds(db, run) == ["model_turn", "tool_result"] * (CAP - 1) + ["model_turn"]


def test_the_cap_counts_the_model_calls_of_earlier_attempts(db, fake) -> None:
    fake.set_scenario(never_answers)
    fake.inject(None, drop_connection(after_events=2))  # the second request is cut: released
    run = enqueue_agent(db, "Weather?", system=None, tools=[WEATHER], metadata={}, max_attempts=3)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("failed", 2), row
    assert row["error"].startswith(f"max_model_calls: the run made {CAP} model calls"), row["error"]
    assert [r.outcome for r in fake.requests] == ["ok", "dropped"] + ["ok"] * (CAP - 1)
    assert kinds(db, run).count("model_turn") == CAP


@pytest.mark.parametrize("at_seq", [4, 2 * CAP - 1], ids=["below-the-cap", "at-the-cap"])
def test_a_forks_copied_steps_are_not_its_model_calls(db, fake, at_seq) -> None:
    """fork_run gives a fork its source's steps 1..at_seq: the source paid for those model calls,
    not the fork. Counted as the fork's own, a fork of a run with CAP model turns failed at once,
    without a request (at-the-cap), and one with CAP - 1 was allowed one call (below-the-cap)."""
    fake.set_scenario(never_answers)
    source = enqueue_agent(db, "Weather?", system=None, tools=[WEATHER], metadata={}, max_attempts=3)
    assert finish(db, source)["status"] == "failed"
    assert kinds(db, source).count("model_turn") == CAP
    fake.reset()
    fake.set_scenario(never_answers)
    fork = db.execute("SELECT new_run_id FROM runrow.fork_run(run_id => %s, at_seq => %s)", (source, at_seq))
    run = fork.fetchone()[0]
    given = kinds(db, run).count("model_turn")
    assert given in (CAP - 1, CAP)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("failed", 1), row
    assert row["error"].startswith(f"max_model_calls: the run made {CAP} model calls"), row["error"]
    assert len(fake.requests) == CAP
    assert kinds(db, run).count("model_turn") == given + CAP
