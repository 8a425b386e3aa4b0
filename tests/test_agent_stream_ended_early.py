"""A response stream that ends cleanly before `message_stop` (a proxy or load balancer closing the
SSE body: the fake's `end` fault) is a transient failure of that model call, with the real SDK
against the fake Messages API and a real worker.

The SDK raises nothing for it: get_final_message returns the snapshot so far, stop_reason None and
a tool_use's input as far as it got. That snapshot was committed as the turn: the run then failed
for good ("no recorded stop_reason"), and an attempt resumed from the step log ran the tool with
the half-received input. Now nothing is stored, the usage streamed is paid, and the run is
released and asks again; a turn without stop_reason already in a step log never runs its tools.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from agent_support import InProcessWorker, enqueue_agent, module_conn, module_db, steps
from worker_support import events, run_row, wait_status

from pyworker.agent import loop
from pyworker.agent.model import ModelTurn
from pyworker.agent.tools import ToolRegistry, tool
from pyworker.fake.faults import end_stream
from pyworker.fake.scenarios import ModelRequest, Text, ToolCall, turn
from pyworker.fake.server import FakeModel

__all__ = ["module_conn", "module_db"]

TERMINAL = {"completed", "failed", "cancelled", "dead"}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}
WEATHER = {"name": "get_weather", "description": "Weather of a city.", "input_schema": SCHEMA}
FULL_INPUT = {"city": "Paris", "unit": "fahrenheit, and a note long enough to be cut"}

registry = ToolRegistry()
calls: list[dict[str, Any]] = []


@tool(input_schema=SCHEMA, description="Weather.", effect="non_idempotent", into=registry)
def get_weather(city: str, idempotency_key: str, unit: str = "celsius") -> dict[str, Any]:
    calls.append({"city": city, "unit": unit})
    return {"city": city, "sky": "sunny"}


def weather(request: ModelRequest) -> Any:
    if request.tool_results:
        return turn(Text("Done."))
    return turn(ToolCall("get_weather", FULL_INPUT))


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModel]:
    with FakeModel(weather) as server:
        yield server


@pytest.fixture(scope="module")
def worker(module_db: str, fake: FakeModel) -> Iterator[InProcessWorker]:
    config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "test-key", "registry": registry}
    with InProcessWorker(module_db, "ended-early", config=config, lease_seconds=2, concurrency=2) as w:
        yield w


@pytest.fixture
def db(module_conn: psycopg.Connection, fake: FakeModel, worker: InProcessWorker) -> psycopg.Connection:
    fake.reset()
    fake.set_scenario(weather)
    calls.clear()
    return module_conn


def finish(db: psycopg.Connection, run: uuid.UUID, timeout: float = 30) -> dict[str, Any]:
    wait_status(db, run, TERMINAL, timeout)
    return run_row(db, run)


def stored_usage(db: psycopg.Connection, run: uuid.UUID) -> int:
    (tokens,) = db.execute(
        "SELECT coalesce(sum((usage->>'input_tokens')::bigint + (usage->>'output_tokens')::bigint), 0) "
        "FROM runrow.agent_step WHERE run_id = %s",
        (run,),
    ).fetchone()
    return int(tokens)


def test_a_stream_ended_inside_a_tool_input_is_asked_again_and_the_tool_gets_its_whole_input(
    db, fake
) -> None:
    # message_start, content_block_start, ping, then three input_json_delta pieces: the input
    # so far is '{"city": "Paris", "unit"', which the SDK's partial parse makes {"city": "Paris"}.
    fake.inject(end_stream(after_events=6))
    run = enqueue_agent(db, "Weather?", system=None, tools=[WEATHER], metadata={}, max_attempts=3)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 2), row
    assert calls == [FULL_INPUT]  # once, and with every argument
    assert [kind for _, kind, _ in steps(db, run)] == ["model_turn", "tool_result", "model_turn"]
    first_turn = json.loads(steps(db, run)[0][2])
    assert [b["input"] for b in first_turn if b["type"] == "tool_use"] == [FULL_INPUT]
    stops = db.execute(
        "SELECT stop_reason FROM runrow.agent_step WHERE run_id = %s AND kind = 'model_turn' ORDER BY seq",
        (run,),
    ).fetchall()
    assert stops == [("tool_use",), ("end_turn",)]
    assert [r.outcome for r in fake.requests] == ["ended_early", "ok", "ok"]
    journaled = [e["type"] for e in events(db, run)]
    assert "run_requeued" in journaled
    # The cut response billed its input: paid for, though nothing of it was stored.
    billed = fake.requests[0].response["usage"]["input_tokens"]
    (spent,) = db.execute("SELECT spent_tokens FROM runrow.agent_run WHERE id = %s", (run,)).fetchone()
    assert billed > 0 and spent >= stored_usage(db, run) + billed, (spent, billed)


@pytest.mark.parametrize("after_events", [6, 0, 1])
def test_a_stream_ended_early_fails_the_last_attempt_without_storing_it(db, fake, after_events: int) -> None:
    """Also a body that ends before any event (0): the SDK then has no snapshot and failed an
    assertion in get_final_message, and the run was released as 'handler raised: AssertionError'."""
    fake.inject(end_stream(after_events=after_events))
    run = enqueue_agent(db, "Weather?", system=None, tools=[WEATHER], metadata={}, max_attempts=1)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("failed", 1), row
    assert row["error"].startswith("model stream ended before message_stop"), row["error"]
    assert steps(db, run) == [] and calls == []
    assert len(fake.requests) == 1


def test_a_text_answer_ended_early_is_asked_again(db, fake) -> None:
    """Not only a tool input: a text answer cut short is not the answer either."""
    fake.set_scenario(lambda request: turn(Text("The weather in Paris is sunny, as it often is.")))
    fake.inject(end_stream(after_events=5))
    run = enqueue_agent(db, "Weather?", system=None, tools=[], metadata={}, max_attempts=2)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 2), row
    assert row["result"] == {
        "text": "The weather in Paris is sunny, as it often is.",
        "stop_reason": "end_turn",
    }
    assert [kind for _, kind, _ in steps(db, run)] == ["model_turn"]


def test_a_committed_turn_without_stop_reason_never_runs_its_tools(db, fake, monkeypatch) -> None:
    """A step log that already holds such a turn (a worker before this fix committed the partial
    snapshot, then died before acting on it): the attempt that resumes it must not run the
    tool_use with its half input, nor pay the model again past it."""
    real_stream_turn = loop.stream_turn
    real_ending = loop._ending
    died: list[bool] = []

    async def as_an_older_worker(*args: Any, **kwargs: Any) -> ModelTurn:
        if died:
            return await real_stream_turn(*args, **kwargs)
        # What the older worker committed: the SDK's snapshot of the stream cut after the
        # third input piece, with the request id and usage the stream had reported.
        content = [
            {"type": "tool_use", "id": "toolu_01cut", "name": "get_weather", "input": {"city": "Paris"}}
        ]
        message = {
            "id": "msg_01cut",
            "type": "message",
            "role": "assistant",
            "model": "claude-fake-1",
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 50, "output_tokens": 1},
        }
        return ModelTurn(message, json.dumps(content), None, message["usage"], "req_01cut")

    def dies_after_the_commit(stop: str | None, text: str, message: dict[str, Any] | None) -> Any:
        if stop is None and not died:
            died.append(True)
            raise RuntimeError("simulated worker death after the commit")
        return real_ending(stop, text, message)

    monkeypatch.setattr(loop, "stream_turn", as_an_older_worker)
    monkeypatch.setattr(loop, "_ending", dies_after_the_commit)
    run = enqueue_agent(db, "Weather?", system=None, tools=[WEATHER], metadata={}, max_attempts=3)
    row = finish(db, run)
    assert died, "the older worker's turn was committed"
    assert calls == [], "the truncated tool call ran"
    assert (row["status"], row["attempt"]) == ("failed", 2), row
    assert row["error"].startswith("the last model turn has no recorded stop_reason"), row["error"]
    assert "tool calls were not run" in row["error"]
    assert fake.requests == []  # nor was the model paid again
    assert [kind for _, kind, _ in steps(db, run)] == ["model_turn"]
