"""A refused turn is left out of every later turn's model input (conversation_history), with the real
SDK against the fake Messages API and a real worker.

The API documents that after a refusal the conversation context must be reset: "Attempting to
continue without resetting will result in continued refusals." The fake does the same (any request
whose history still holds a refused exchange is refused again), so a worker that sends the refused
turn back gets every later turn refused, and pays for each.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from agent_support import InProcessWorker, enqueue_agent, module_conn, module_db, undecorated
from worker_support import run_row, wait_status

from pyworker.agent.tools import ToolRegistry
from pyworker.fake.scenarios import ModelRequest, Text, turn
from pyworker.fake.server import FakeModel

__all__ = ["module_conn", "module_db"]

TERMINAL = {"completed", "failed", "cancelled", "dead"}
REFUSED_ANSWER = "I can't help with"


def refuses_weapons(request: ModelRequest) -> Any:
    """Refuses a request that asks for a weapon, answers anything else."""
    if "weapon" in request.last_user_text:
        return turn(
            Text(REFUSED_ANSWER),
            stop_reason="refusal",
            stop_details={"type": "refusal", "category": "cyber", "explanation": "declined"},
        )
    return turn(Text("Sure: " + request.last_user_text))


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModel]:
    with FakeModel(refuses_weapons, api_key="test-key") as server:
        yield server


@pytest.fixture(scope="module")
def worker(module_db: str, fake: FakeModel) -> Iterator[InProcessWorker]:
    config: dict[str, Any] = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "test-key"}
    config["registry"] = ToolRegistry()
    with InProcessWorker(module_db, "refusal", config=config, lease_seconds=5, concurrency=1) as w:
        yield w


@pytest.fixture
def db(module_conn: psycopg.Connection, fake: FakeModel, worker: InProcessWorker) -> psycopg.Connection:
    fake.reset()
    fake.set_scenario(refuses_weapons)
    return module_conn


def finish(db: psycopg.Connection, run: uuid.UUID) -> dict[str, Any]:
    wait_status(db, run, TERMINAL, 30)
    return run_row(db, run)


def say(db: psycopg.Connection, text: str, conversation: uuid.UUID | None = None) -> uuid.UUID:
    return enqueue_agent(db, text, conversation_id=conversation, system=None, tools=[], metadata={})


def test_the_fake_keeps_refusing_a_history_that_holds_a_refused_exchange(db, fake) -> None:
    """The fake as the API: the refused exchange sent back makes any later request a refusal, even
    one the scenario would answer."""
    import anthropic

    client = anthropic.Anthropic(base_url=fake.base_url, api_key="test-key")
    first = client.messages.create(
        model="claude-fake-1", max_tokens=100, messages=[{"role": "user", "content": "build a weapon"}]
    )
    assert first.stop_reason == "refusal"
    again = client.messages.create(
        model="claude-fake-1",
        max_tokens=100,
        messages=[
            {"role": "user", "content": "build a weapon"},
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {"role": "user", "content": "what is 2+2?"},
        ],
    )
    assert again.stop_reason == "refusal"
    reset = client.messages.create(
        model="claude-fake-1", max_tokens=100, messages=[{"role": "user", "content": "what is 2+2?"}]
    )
    assert reset.stop_reason == "end_turn"


def test_a_turn_after_a_refused_one_is_answered_without_it(db, fake) -> None:
    first = say(db, "build a weapon")
    row1 = finish(db, first)
    assert (row1["status"], row1["result"]["stop_reason"]) == ("completed", "refusal")
    sql = "SELECT conversation_id FROM runrow.agent_run WHERE id = %s"
    conversation = db.execute(sql, [first]).fetchone()[0]

    second = say(db, "what is 2+2?", conversation)
    row2 = finish(db, second)
    assert (row2["status"], row2["result"]["stop_reason"]) == ("completed", "end_turn"), row2
    third = say(db, "tell me a joke", conversation)
    row3 = finish(db, third)
    assert (row3["status"], row3["result"]["stop_reason"]) == ("completed", "end_turn"), row3

    assert len(fake.requests) == 3, "one model call per turn"
    sent2 = undecorated(fake.requests[1].body)["messages"]
    sent3 = undecorated(fake.requests[2].body)["messages"]
    for sent in (sent2, sent3):
        text = json.dumps(sent)
        assert "weapon" not in text and REFUSED_ANSWER not in text, sent
    assert sent2 == [{"role": "user", "content": "what is 2+2?"}]
    assert [m["role"] for m in sent3] == ["user", "assistant", "user"]
    assert sent3[0]["content"] == "what is 2+2?" and sent3[-1]["content"] == "tell me a joke"
