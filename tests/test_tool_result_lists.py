"""A tool that returns a list, with the real SDK against the fake Messages API and a real worker.

A tool_result's content is a string or a list of content blocks (text, image, search_result,
document, ...); the API refuses anything else in the list. A tool's ordinary list (rows, names)
was sent as the content and the next request was refused (400 tool_result.content.0) after the
tool had run, failing the run. complete_tool_call decides: such a list goes as its JSON text.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import psycopg
import pytest
from agent_support import InProcessWorker, enqueue_agent, module_conn, module_db, undecorated
from worker_support import run_row, wait_status

from pyworker.agent.tools import ToolRegistry, tool
from pyworker.fake.scenarios import ModelRequest, Text, ToolCall, turn
from pyworker.fake.server import FakeModel

__all__ = ["module_conn", "module_db"]

TERMINAL = {"completed", "failed", "cancelled", "dead"}
ROWS = [{"id": 1, "name": "alpha"}, {"id": 2, "name": "beta"}]
NAMES = ["a", "b"]
BLOCKS = [{"type": "text", "text": "alpha"}, {"type": "text", "text": "beta"}]
NO_ARGS = {"type": "object", "properties": {}}

registry = ToolRegistry()
calls: list[str] = []


@tool(input_schema=NO_ARGS, description="Rows.", effect="pure", into=registry)
def find_rows() -> list[dict[str, Any]]:
    calls.append("find_rows")
    return ROWS


@tool(input_schema=NO_ARGS, description="Names.", effect="pure", into=registry)
def list_names() -> list[str]:
    calls.append("list_names")
    return NAMES


@tool(input_schema=NO_ARGS, description="Text blocks.", effect="pure", into=registry)
def as_blocks() -> list[dict[str, Any]]:
    calls.append("as_blocks")
    return BLOCKS


def offered(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "description": n, "input_schema": NO_ARGS} for n in names]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModel]:
    with FakeModel("text", api_key="test-key") as server:
        yield server


@pytest.fixture(scope="module")
def worker(module_db: str, fake: FakeModel) -> Iterator[InProcessWorker]:
    config: dict[str, Any] = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "test-key"}
    config["registry"] = registry
    with InProcessWorker(module_db, "tool-lists", config=config, lease_seconds=5, concurrency=1) as w:
        yield w


@pytest.fixture
def db(module_conn: psycopg.Connection, fake: FakeModel, worker: InProcessWorker) -> psycopg.Connection:
    fake.reset()
    calls.clear()
    return module_conn


def calls_then_answers(name: str) -> Any:
    def answer(request: ModelRequest) -> Any:
        if request.tool_results:
            return turn(Text("Got them."))
        return turn(ToolCall(name, {}))

    return answer


def finish(db: psycopg.Connection, run: uuid.UUID) -> dict[str, Any]:
    wait_status(db, run, TERMINAL, 30)
    return run_row(db, run)


def test_the_fake_refuses_a_tool_result_list_of_plain_values(fake) -> None:
    client = anthropic.Anthropic(base_url=fake.base_url, api_key="test-key", max_retries=0)
    use = {"type": "tool_use", "id": "tu_1", "name": "find_rows", "input": {}}
    messages: list[Any] = [
        {"role": "user", "content": "rows?"},
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": ROWS}]},
    ]
    with pytest.raises(anthropic.BadRequestError, match=r"tool_result\.content\.0"):
        client.messages.create(model="claude-fake-1", max_tokens=100, messages=messages)
    messages[2]["content"][0]["content"] = BLOCKS
    assert client.messages.create(model="claude-fake-1", max_tokens=100, messages=messages).stop_reason


@pytest.mark.parametrize(
    ("name", "returned"), [("find_rows", ROWS), ("list_names", NAMES)], ids=["rows", "plain-values"]
)
def test_a_tool_returning_a_list_completes_with_its_json_text(db, fake, name, returned) -> None:
    fake.set_scenario(calls_then_answers(name))
    run = enqueue_agent(db, "list please", system=None, tools=offered(name), metadata={}, max_attempts=1)
    row = finish(db, run)
    assert (row["status"], row["error"]) == ("completed", None), row
    assert calls == [name], "the tool ran once"
    assert len(fake.requests) == 2 and fake.requests[1].status == 200
    result = undecorated(fake.requests[1].body)["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and isinstance(result["content"], str)
    assert json.loads(result["content"]) == returned


def test_a_tool_returning_content_blocks_sends_them_as_blocks(db, fake) -> None:
    fake.set_scenario(calls_then_answers("as_blocks"))
    tools = offered("as_blocks")
    run = enqueue_agent(db, "blocks please", system=None, tools=tools, metadata={}, max_attempts=1)
    row = finish(db, run)
    assert row["status"] == "completed", row
    result = undecorated(fake.requests[1].body)["messages"][-1]["content"][0]
    assert result["content"] == BLOCKS
