"""Each stop_reason and each injected fault ends as pyworker/agent/loop.py's table says, with the real SDK
against the fake Messages API and a real worker (in-process, on its own event loop).

end_turn → completed; tool_use → tools run, loop continues; pause_turn → content sent back;
refusal → completed (stop_reason refusal); max_tokens, model_context_window_exceeded → failed with
a clear error; 529 retried by the SDK, a 429 reported and asked again once its block ends;
retries exhausted, an error event mid-stream or a dropped
connection → released (requeued while attempts are left, else failed); other 4xx → failed; cancel
mid-stream or between steps → cancelled with the partial text; irreversible tools wait for a person.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from agent_support import (
    InProcessWorker,
    enqueue_agent,
    fake,
    module_conn,
    module_db,
    steps,
    undecorated,
)
from worker_support import events, run_row, streamed_text, wait_status, wait_until

from pyworker.agent.tools import ToolRegistry, tool
from pyworker.cli.main import main as cli
from pyworker.cli.tail_render import Renderer
from pyworker.db.keys import tool_call_key
from pyworker.fake.faults import (
    drop_connection,
    error_event,
    overloaded,
    rate_limited,
    slow,
    status_error,
)
from pyworker.fake.scenarios import ModelRequest, Text, ToolCall, script, turn
from pyworker.fake.server import FakeModel

__all__ = ["fake", "module_conn", "module_db"]

TERMINAL = {"completed", "failed", "cancelled", "dead"}
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
LAUNCH = {
    "name": "launch",
    "description": "Launch a rocket. Irreversible.",
    "input_schema": {"type": "object", "properties": {"target": {"type": "string"}}},
}
LONG_TEXT = " ".join(f"word{i}" for i in range(300))

registry = ToolRegistry()
calls: list[tuple[str, dict[str, Any], str]] = []
behaviour: dict[str, Any] = {"weather_raises": False, "weather_blocks": None, "weather_does": None}


@tool(input_schema=WEATHER["input_schema"], description="Weather.", effect="pure", into=registry)
def get_weather(city: str, idempotency_key: str, unit: str = "celsius") -> dict[str, Any]:
    calls.append(("get_weather", {"city": city}, idempotency_key))
    blocker = behaviour["weather_blocks"]
    if blocker is not None:
        blocker.wait(10)
    if behaviour["weather_raises"]:
        raise RuntimeError("weather service is down")
    if behaviour["weather_does"] is not None:
        return behaviour["weather_does"]()
    return {"city": city, "sky": "sunny"}


@tool(input_schema=WEATHER["input_schema"], description="Forecast.", effect="non_idempotent", into=registry)
async def get_forecast(city: str, idempotency_key: str) -> str:
    calls.append(("get_forecast", {"city": city}, idempotency_key))
    raise asyncio.CancelledError("an inner request of the tool was cancelled")


@tool(input_schema=LAUNCH["input_schema"], description="Launch.", effect="irreversible", into=registry)
async def launch(target: str, idempotency_key: str) -> str:
    calls.append(("launch", {"target": target}, idempotency_key))
    return f"launched to {target}"


def summary(request: ModelRequest) -> Any:
    results = request.tool_results
    return turn(Text("Results: " + "; ".join(f"{r.get('is_error')}:{r.get('content')}" for r in results)))


SCENARIOS = {
    "launch": script(turn(Text("Launching."), ToolCall("launch", {"target": "moon"})), summary),
    "long": script(turn(Text(LONG_TEXT))),
}


@pytest.fixture(scope="module")
def worker(module_db: str, fake: FakeModel) -> Iterator[InProcessWorker]:
    config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "test-key", "registry": registry}
    with InProcessWorker(module_db, "outcomes", config=config, lease_seconds=2, concurrency=2) as w:
        yield w


@pytest.fixture
def db(module_conn: psycopg.Connection, fake: FakeModel, worker: InProcessWorker) -> psycopg.Connection:
    fake.reset()
    fake.set_scenario("text")
    calls.clear()
    behaviour.update(weather_raises=False, weather_blocks=None, weather_does=None)
    return module_conn


def use(fake: FakeModel, scenario: str) -> None:
    fake.set_scenario(SCENARIOS.get(scenario) or scenario)


def finish(db: psycopg.Connection, run: uuid.UUID, timeout: float = 30) -> dict[str, Any]:
    wait_status(db, run, TERMINAL, timeout)
    return run_row(db, run)


def kinds(db: psycopg.Connection, run: uuid.UUID) -> list[str]:
    return [kind for _, kind, _ in steps(db, run)]


# -- stop reasons ------------------------------------------------------------------------------


def test_end_turn_completes_and_the_step_is_the_message_as_received(db, fake) -> None:
    use(fake, "thinking")
    run = enqueue_agent(db, "Hi!", system="Be kind.", tools=[WEATHER])
    row = finish(db, run)
    assert row["status"] == "completed"
    assert row["result"] == {"text": "Hello!", "stop_reason": "end_turn"}
    [(seq, _, payload)] = steps(db, run)
    request = fake.requests[-1]
    assert json.loads(payload) == request.response["content"]  # thinking + signature, as sent
    assert [b["type"] for b in json.loads(payload)] == ["thinking", "text"]
    stored_request_id = db.execute(
        "SELECT request_id FROM runrow.agent_step WHERE run_id = %s AND seq = %s", (run, seq)
    ).fetchone()
    assert stored_request_id == (request.request_id,)
    # Model, system, tools from the run's pinned prompt; max_tokens and thinking from its metadata.
    body = undecorated(request.body)
    assert (body["model"], body["system"], body["tools"]) == ("claude-fake-1", "Be kind.", [WEATHER])
    assert (body["max_tokens"], body["thinking"]) == (4096, {"type": "enabled", "budget_tokens": 1024})
    assert body["stream"] is True
    journaled = events(db, run)
    [turn_event] = [e for e in journaled if e["type"] == "model_turn"]
    assert turn_event["step_seq"] == seq and turn_event["stop_reason"] == "end_turn"
    assert turn_event["request_id"] == request.request_id and turn_event["usage"]["output_tokens"] > 0
    assert streamed_text(db, run) == "Hello!"
    assert any(e["type"] == "thinking_delta" for e in journaled)


def test_every_pinned_request_parameter_reaches_the_api(db, fake) -> None:
    """Sampling parameters pinned in metadata go in the request even where the SDK's stream()
    no longer names them (anthropic 2.17: temperature, top_p, top_k). Passed as keywords they
    raised TypeError before any request, on every attempt of every such run."""
    pinned = {"temperature": 0.5, "top_p": 0.9, "top_k": 40, "stop_sequences": ["END"], "max_tokens": 300}
    run = enqueue_agent(db, "Hi!", tools=[], metadata=pinned)
    row = finish(db, run)
    assert row["status"] == "completed", row
    assert row["attempt"] == 1
    body = undecorated(fake.requests[-1].body)
    assert {k: body.get(k) for k in pinned} == pinned


def test_tool_use_runs_the_tool_with_its_key_and_continues(db, fake) -> None:
    use(fake, "tool_use")
    run = enqueue_agent(db, "Weather?", tools=[WEATHER], metadata={})
    row = finish(db, run)
    assert row["status"] == "completed", row
    assert kinds(db, run) == ["model_turn", "tool_result", "model_turn"]
    first_turn = json.loads(steps(db, run)[0][2])
    [use_block] = [b for b in first_turn if b["type"] == "tool_use"]
    assert calls == [
        (
            "get_weather",
            {"city": "Paris"},
            tool_call_key(run, 1, use_block["id"], "get_weather", {"city": "Paris"}),
        )
    ]
    result = json.loads(steps(db, run)[1][2])
    assert result["is_error"] is False and json.loads(result["content"]) == {"city": "Paris", "sky": "sunny"}
    assert "sunny" in row["result"]["text"]
    assert [e["type"] for e in events(db, run) if e["type"] in ("tool_call", "tool_result")] == [
        "tool_call",
        "tool_result",
    ]


def test_pause_turn_sends_the_content_back_and_continues(db, fake) -> None:
    use(fake, "pause_turn")
    run = enqueue_agent(db, "Search.", tools=[], metadata={})
    row = finish(db, run)
    assert row["status"] == "completed"
    assert row["result"]["text"] == "Searching for a while... Found it: the answer is 42."
    assert kinds(db, run) == ["model_turn", "model_turn"]
    first, second = fake.requests
    assert undecorated(second.body["messages"][-1]) == {
        "role": "assistant",
        "content": first.response["content"],
    }


def test_a_pause_turn_without_content_fails_saying_why(db, fake) -> None:
    """It failed as an 'unexpected stop_reason' (the agent-loop audit): nothing can be sent back
    for an empty paused turn, and asking again might pay for the same pause without end."""
    fake.set_scenario(script(turn(stop_reason="pause_turn")))
    run = enqueue_agent(db, "Search.", tools=[], metadata={})
    row = finish(db, run)
    assert row["status"] == "failed" and row["attempt"] == 1, row
    assert row["error"].startswith("pause_turn without content: there is nothing to send back"), row["error"]
    assert len(fake.requests) == 1


@pytest.mark.parametrize(
    ("scenario", "status", "stop_reason", "error"),
    [
        ("refusal", "completed", "refusal", None),
        ("max_tokens", "failed", "max_tokens", "max_tokens: the answer was cut off"),
        ("context_window", "failed", "model_context_window_exceeded", "model_context_window_exceeded: "),
    ],
)
def test_ending_stop_reasons(db, fake, scenario, status, stop_reason, error) -> None:
    use(fake, scenario)
    run = enqueue_agent(db, "Go.", tools=[], metadata={"max_tokens": 300})
    row = finish(db, run)
    assert (row["status"], row["result"]["stop_reason"]) == (status, stop_reason)
    assert row["attempt"] == 1
    if error is None:
        assert row["error"] is None
    else:
        assert row["error"].startswith(error)
    assert row["result"]["text"] == streamed_text(db, run)  # the text the model did produce is kept
    assert kinds(db, run) == ["model_turn"]  # the turn is on record either way
    if scenario == "refusal":
        assert row["result"]["stop_details"]["type"] == "refusal"
        # Kept beside the step too, for an attempt that resumes after the turn (test_agent_resume).
        (turn_event,) = [e for e in events(db, run) if e["type"] == "model_turn"]
        assert turn_event["stop_details"] == row["result"]["stop_details"]


def test_unknown_tool_and_raising_tool_are_errors_the_model_sees(db, fake) -> None:
    use(fake, "parallel_tools")  # get_weather (raises) and get_time (not in this worker)
    behaviour["weather_raises"] = True
    run = enqueue_agent(db, "Both.", tools=[WEATHER, TIME], metadata={})
    row = finish(db, run)
    assert row["status"] == "completed"
    results = [json.loads(p) for _, kind, p in steps(db, run) if kind == "tool_result"]
    assert [r["is_error"] for r in results] == [True, True]
    assert results[0]["content"] == "RuntimeError: weather service is down"
    assert results[1]["content"].startswith("Unknown tool 'get_time'")
    sent = undecorated(fake.requests[-1].body["messages"][-1]["content"])
    assert [b["is_error"] for b in sent] == [True, True]


def _exits() -> Any:
    raise SystemExit(3)


@pytest.mark.parametrize(
    ("does", "content"),
    [
        # More than the model is sent (MAX_TOOL_RESULT_CHARS): a 5 MB result was stored, then the
        # next request was refused as too long, failing the run and every retry (the
        # long-conversation audit). complete_tool_call's own 8 MiB limit is not reached first.
        (lambda: "x" * (9 * 1024 * 1024), "The tool get_weather ran, but returned 9,437,184 characters"),
        (lambda: {"rows": ["y" * 100] * 2100}, "The tool get_weather ran, but returned 218,"),
        (lambda: "binary\x00data", "The tool ran, but its result cannot be recorded: SQLSTATE 22P05"),
        (_exits, "SystemExit: 3"),
    ],
    ids=["over-the-limit", "over-the-limit-as-JSON", "NUL", "SystemExit"],
)
def test_what_a_tool_cannot_return_is_an_error_the_model_sees(db, fake, does, content) -> None:
    """The tools audit: a result the database cannot store ended the run failed (its effect
    left executing), and a SystemExit raised in a tool's thread stopped the whole worker."""
    fake.set_scenario(script(turn(Text("Checking."), ToolCall("get_weather", {"city": "Oslo"})), summary))
    behaviour["weather_does"] = does
    run = enqueue_agent(db, "Weather?", tools=[WEATHER], metadata={})
    row = finish(db, run)
    assert row["status"] == "completed", row
    (result,) = [json.loads(p) for _, kind, p in steps(db, run) if kind == "tool_result"]
    assert result["is_error"] is True and result["content"].startswith(content), result["content"][:200]
    effect = db.execute("SELECT state FROM runrow.tool_effect WHERE run_id = %s", (run,)).fetchone()
    assert effect == ("done",)


def test_a_tool_result_with_nan_is_sent_as_text(db, fake) -> None:
    fake.set_scenario(script(turn(Text("Checking."), ToolCall("get_weather", {"city": "Oslo"})), summary))
    behaviour["weather_does"] = lambda: {"v": float("nan")}
    run = enqueue_agent(db, "Weather?", tools=[WEATHER], metadata={})
    assert finish(db, run)["status"] == "completed"
    (result,) = [json.loads(p) for _, kind, p in steps(db, run) if kind == "tool_result"]
    assert (result["is_error"], result["content"]) == (False, "{'v': nan}")


def test_a_cancelled_error_a_tool_raises_itself_is_its_failure_not_a_stop(db, fake) -> None:
    """An async tool whose own inner await was cancelled raised CancelledError, which the loop
    took for a stop: the call was recorded uncertain and the run ended cancelled, though nobody
    had stopped it (the tools audit)."""
    fake.set_scenario(script(turn(Text("Checking."), ToolCall("get_forecast", {"city": "Oslo"})), summary))
    run = enqueue_agent(db, "Forecast?", tools=[{**WEATHER, "name": "get_forecast"}], metadata={})
    row = finish(db, run)
    assert row["status"] == "completed", row
    (result,) = [json.loads(p) for _, kind, p in steps(db, run) if kind == "tool_result"]
    assert result["is_error"] is True and result["content"].startswith("CancelledError"), result


# -- faults ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("faults", "requests"),
    [([rate_limited(0.01)], 2), ([overloaded(0.01), overloaded(0.01)], 3)],
    ids=["429", "529x2"],
)
def test_429_and_529_are_retried_inside_the_attempt(db, fake, faults, requests) -> None:
    fake.inject(*faults)
    run = enqueue_agent(db, "Hi", tools=[], metadata={}, max_attempts=1)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 1)
    assert [r.status for r in fake.requests] == [faults[0].status] * (requests - 1) + [200]


FAILED_STEPS = {
    "retries exhausted (529 x3)": ([overloaded(0.01)] * 3, "model API error (retries exhausted): HTTP 529"),
    "error event mid-stream": ([error_event(after_events=4)], "model stream error mid-response"),
    "dropped connection": ([drop_connection(after_events=4)], "model stream broken mid-response"),
}


@pytest.mark.parametrize("name", list(FAILED_STEPS))
def test_a_failed_step_fails_the_last_attempt(db, fake, name) -> None:
    faults, error = FAILED_STEPS[name]
    fake.inject(*faults)
    run = enqueue_agent(db, "Hi", tools=[], metadata={}, max_attempts=1)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("failed", 1)
    assert row["error"].startswith(error), row["error"]
    assert steps(db, run) == []


@pytest.mark.parametrize("name", list(FAILED_STEPS))
def test_a_failed_step_is_requeued_while_attempts_are_left(db, fake, name) -> None:
    faults, _ = FAILED_STEPS[name]
    fake.inject(*faults)
    run = enqueue_agent(db, "Hi", tools=[], metadata={}, max_attempts=2)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 2)
    assert "run_requeued" in [e["type"] for e in events(db, run)]


def rendered_answer(db: psycopg.Connection, run: uuid.UUID) -> str:
    """What a piped `runrow tail` prints from the run's whole journal."""
    out, err = io.StringIO(), io.StringIO()
    renderer = Renderer(out, err, live=False)
    for event in events(db, run):
        renderer.event(event["seq"], {k: v for k, v in event.items() if k != "seq"})
    return out.getvalue()


@pytest.mark.parametrize("error_type", ["authentication_error", "billing_error", "permission_error"])
def test_text_streamed_before_a_key_error_mid_stream_is_not_in_the_answer(db, fake, error_type) -> None:
    """A key error arriving as an `error` event mid-stream defers the run with its attempt given
    back, so the next claim is attempt 1 again. The text streamed before the error was shown to
    every client and was never taken back: the journal said text_delta, run_requeued,
    run_claimed, text_delta, and a tail printed 234 characters for a 210-character answer (the
    worker audit). What a tail renders from the journal is the run's result."""
    use(fake, "long")
    fake.inject(error_event(after_events=20, error_type=error_type, message="the key is not valid"))
    model = f"claude-fake-midkey-{uuid.uuid4().hex[:6]}"  # a rate_limit_key of its own
    run = enqueue_agent(db, "Talk.", model=model, tools=[], metadata={}, max_attempts=1)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 1), row["error"]
    types = [e["type"] for e in events(db, run)]
    assert types.count("run_claimed") == 2, types
    assert "text_delta" in types[: types.index("run_requeued")], "the first claim streamed text"
    assert rendered_answer(db, run) == row["result"]["text"] == LONG_TEXT


def test_a_resumed_attempt_does_not_take_back_again_what_a_deferral_took_back(db, fake) -> None:
    """Attempt 1 is cut off mid-stream (requeued: attempt 2 takes its text back), attempt 2 by a
    key error mid-stream (deferred: the deferral takes its text back), and the claim after it,
    attempt 2 again, finds nothing left to take back: one superseded event each, no third
    naming the same deltas again."""
    use(fake, "long")
    fake.inject(error_event(after_events=20), error_event(after_events=20, error_type="billing_error"))
    model = f"claude-fake-midkey-{uuid.uuid4().hex[:6]}"
    run = enqueue_agent(db, "Talk.", model=model, tools=[], metadata={}, max_attempts=2)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 2), row["error"]
    journal = events(db, run)
    assert [e["type"] for e in journal].count("run_claimed") == 3
    taken_back = [(e["attempt"], e["after_seq"]) for e in journal if e["type"] == "superseded"]
    claimed_first = next(e["seq"] for e in journal if e["type"] == "run_claimed")
    assert taken_back == [(2, claimed_first), (2, claimed_first)], journal
    assert rendered_answer(db, run) == row["result"]["text"] == LONG_TEXT


def test_text_streamed_before_a_rate_limit_error_event_is_taken_back_before_the_call_is_made_again(
    db, fake
) -> None:
    """A rate_limit_error event mid-stream is a 429: waited out and the model asked again in the
    same attempt. Nothing took back what the cut response had streamed, so a client showed it
    and then the whole answer (the review of 97011fe: model_request, text_delta, model_request,
    text_delta, model_turn, complete, the text twice). The attempt journals `superseded` for it
    before it asks again: A the run's first run_claimed (nothing committed yet), B the seq
    before the event."""
    use(fake, "long")
    fake.inject(error_event(after_events=20, error_type="rate_limit_error", message="slow down"))
    model = f"claude-fake-midrate-{uuid.uuid4().hex[:6]}"
    run = enqueue_agent(db, "Talk.", model=model, tools=[], metadata={}, max_attempts=1)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 1), row["error"]
    assert rendered_answer(db, run) == row["result"]["text"] == LONG_TEXT
    journal = events(db, run)
    types = [e["type"] for e in journal]
    assert types.count("run_claimed") == 1 and types.count("model_request") == 2, types
    [taken_back] = [e for e in journal if e["type"] == "superseded"]
    claimed = next(e["seq"] for e in journal if e["type"] == "run_claimed")
    second_request = [e["seq"] for e in journal if e["type"] == "model_request"][1]
    assert (taken_back["after_seq"], taken_back["attempt"]) == (claimed, 1), taken_back
    assert taken_back["through_seq"] == taken_back["seq"] - 1 < second_request, taken_back


def test_a_rate_limit_error_event_after_a_tool_result_takes_back_only_the_cut_turn(db, fake) -> None:
    """After a committed turn and its tool result, A is the tool_result (the committed work is
    kept), and the answer after the tool call is shown once."""
    fake.set_scenario(
        script(turn(Text("Checking."), ToolCall("get_weather", {"city": "Oslo"})), turn(Text(LONG_TEXT)))
    )
    fake.inject(None, error_event(after_events=20, error_type="rate_limit_error", message="slow down"))
    model = f"claude-fake-midrate-{uuid.uuid4().hex[:6]}"
    run = enqueue_agent(db, "Weather?", model=model, tools=[WEATHER], metadata={}, max_attempts=1)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 1), row["error"]
    journal = events(db, run)
    [taken_back] = [e for e in journal if e["type"] == "superseded"]
    last_result = [e["seq"] for e in journal if e["type"] == "tool_result"][-1]
    assert taken_back["after_seq"] == last_result, (taken_back, journal)
    assert rendered_answer(db, run) == row["result"]["text"] == LONG_TEXT


def test_a_white_space_answer_does_not_stop_the_conversation(db, fake) -> None:
    """The model may end a turn with white space only; the API refuses any request that sends such a
    message back, so every later turn of the conversation failed (the fake, as the API: a 400). The
    next turn's history leaves it out, and the two user turns around it are one message. (An empty
    answer is never stored as a step: _commit_turn.)"""

    def answer(request: ModelRequest) -> Any:
        return turn(Text(" \n")) if request.last_user_text == "say nothing" else turn(Text("Here."))

    fake.set_scenario(answer)
    first = enqueue_agent(db, "say nothing", system=None, tools=[], metadata={})
    assert finish(db, first)["status"] == "completed"
    [conversation] = db.execute("SELECT conversation_id FROM runrow.get_run(%s)", [first]).fetchone()
    second = enqueue_agent(db, "and now?", conversation_id=conversation, system=None, tools=[], metadata={})
    row = finish(db, second)
    assert row["status"] == "completed", row["error"]
    assert row["result"]["text"] == "Here."
    sent = undecorated(fake.requests[-1].body)["messages"]
    assert [m["role"] for m in sent] == ["user"]
    assert [b["text"] for b in sent[0]["content"]] == ["say nothing", "and now?"]


def test_cache_markers_of_many_turns_stay_within_the_apis_four(db, fake) -> None:
    """enqueue_run takes up to 4 cache_control markers a turn; a history holds every turn's, and
    the API refuses a request with more than 4, so a conversation whose turns carried 3 each failed
    from its second turn on (the fake, as the API: a 400). The earliest markers are dropped."""
    marked = [{"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral"}} for i in range(3)]
    fake.set_scenario(script(turn(Text("Noted."))))
    first = enqueue_agent(db, marked, system=None, tools=[], metadata={"prompt_cache": "off"})
    assert finish(db, first)["status"] == "completed"
    [conversation] = db.execute("SELECT conversation_id FROM runrow.get_run(%s)", [first]).fetchone()
    second = enqueue_agent(db, marked, conversation_id=conversation, system=None, tools=[], metadata={})
    row = finish(db, second)
    assert row["status"] == "completed", row["error"]
    sent = json.dumps(fake.requests[-1].body)
    assert sent.count('"cache_control"') == 4


def test_a_users_one_hour_marker_after_the_default_five_minute_one(db, fake) -> None:
    """The API refuses a 1-hour cache marker after a 5-minute one. The worker's default marker on
    the system prompt is a 5-minute one, so a turn whose content asked for an hour failed (the
    fake, as the API: a 400), and so would every later turn, whose history holds it."""
    hour = [{"type": "text", "text": "keep this", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    fake.set_scenario(script(turn(Text("Kept."))))
    run = enqueue_agent(db, hour, system="Be brief.", tools=[], metadata={})
    row = finish(db, run)
    assert row["status"] == "completed", row["error"]
    assert '"ttl": "1h"' not in json.dumps(fake.requests[-1].body)


def test_other_4xx_fails_at_once(db, fake) -> None:
    fake.inject(status_error(400, message="messages: bad request"))
    run = enqueue_agent(db, "Hi", tools=[], metadata={}, max_attempts=3)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("failed", 1)
    assert (
        row["error"]
        == "model API refused the request: HTTP 400: invalid_request_error: messages: bad request"
    )


# -- cancellation -----------------------------------------------------------------------------


def test_cancel_mid_stream_closes_the_stream_and_keeps_the_partial_text(db, fake) -> None:
    use(fake, "long")
    fake.inject(slow(0.05))  # ~300 events: 15 s if nobody stops it
    run = enqueue_agent(db, "Talk.", tools=[], metadata={})
    wait_until(lambda: streamed_text(db, run), 15, "text to stream")
    cancelled_at = time.monotonic()
    db.execute("SELECT runrow.cancel_run(run_id => %s)", (run,))
    row = finish(db, run, timeout=10)
    took = time.monotonic() - cancelled_at
    assert row["status"] == "cancelled"
    partial = row["result"]["text"]
    assert partial and LONG_TEXT.startswith(partial) and len(partial) < len(LONG_TEXT)
    assert partial == streamed_text(db, run)  # what was streamed is what is kept
    assert took < 3, f"cancel took {took:.1f}s: the stream was not closed at once"
    assert steps(db, run) == []
    wait_until(lambda: fake.requests[-1].outcome == "client_closed", 10, "the fake to see the stream closed")
    # The stopped response's input was billed: it is paid for, though nothing was stored.
    billed = fake.requests[-1].response["usage"]["input_tokens"]
    spent = db.execute("SELECT spent_tokens FROM runrow.agent_run WHERE id = %s", (run,)).fetchone()[0]
    assert billed > 0 and spent >= billed, (spent, billed)


def test_cancel_mid_stream_after_a_pause_turn_keeps_the_whole_message_streamed(db, fake) -> None:
    """A paused turn and its continuation are one assistant message. A stop mid-continuation
    kept the continuation's partial text alone, though the paused text had been streamed and a
    tail showed it (the tools audit)."""
    fake.set_scenario(
        script(turn(Text("Searching for a while... "), stop_reason="pause_turn"), turn(Text(LONG_TEXT)))
    )
    fake.inject(None, slow(0.05))  # the continuation streams for ~15 s unless stopped
    run = enqueue_agent(db, "Search.", tools=[], metadata={})
    wait_until(lambda: "word" in streamed_text(db, run), 15, "the continuation to stream")
    db.execute("SELECT runrow.cancel_run(run_id => %s)", (run,))
    row = finish(db, run, timeout=10)
    assert row["status"] == "cancelled"
    kept = row["result"]["text"]
    assert kept.startswith("Searching for a while... word0") and len(kept) < len(LONG_TEXT), kept[:80]
    assert kept == streamed_text(db, run)  # what was streamed is what is kept


def test_cancel_between_steps_stops_before_the_next_model_call(db, fake, worker) -> None:
    use(fake, "tool_use")
    gate = threading.Event()
    behaviour["weather_blocks"] = gate
    run = enqueue_agent(db, "Weather?", tools=[WEATHER], metadata={})
    wait_until(lambda: calls, 15, "the tool to start")
    db.execute("SELECT runrow.cancel_run(run_id => %s)", (run,))
    assert worker.worker.dispatcher is not None
    dispatcher = worker.worker.dispatcher
    wait_until(
        lambda: any(sup.cancel.is_set() for sup in dispatcher.supervisors(run)),
        10,
        "the worker to see the cancel",
    )
    gate.set()
    row = finish(db, run)
    assert row["status"] == "cancelled"
    assert kinds(db, run) == ["model_turn", "tool_result"]  # the tool's result is kept
    assert len(fake.requests) == 1  # and no further model call was made
    assert row["result"]["stop_reason"] == "cancelled"


# -- approvals ---------------------------------------------------------------------------------


def pending(db: psycopg.Connection, run: uuid.UUID) -> list[tuple[str, str]]:
    return db.execute(
        "SELECT idempotency_key, reason FROM runrow.pending_approvals WHERE run_id = %s", (run,)
    ).fetchall()


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_irreversible_tool_waits_for_a_person(db, fake, module_db, capsys, decision) -> None:
    use(fake, "launch")
    run = enqueue_agent(db, "Launch it.", tools=[LAUNCH], metadata={})
    wait_status(db, run, "waiting", 15)
    [(key, reason)] = pending(db, run)
    assert reason == "needs_approval" and calls == []
    assert cli(["--database-url", module_db, "approvals"]) == 0
    assert f"{key}  needs_approval: irreversible, not run yet" in capsys.readouterr().out
    # A blank --by fell back to the login name: a decision recorded for someone who did not make it.
    assert cli(["--database-url", module_db, decision, key, "--by", " "]) == 2
    assert "--by must name the person deciding" in capsys.readouterr().err
    assert cli(["--database-url", module_db, decision, key, "--by", "alice", "--note", "go/no-go"]) == 0
    row = finish(db, run)
    assert row["status"] == "completed", row
    [result] = [json.loads(p) for _, kind, p in steps(db, run) if kind == "tool_result"]
    if decision == "approve":
        assert calls == [("launch", {"target": "moon"}, key)]
        assert result == {
            "type": "tool_result",
            "tool_use_id": result["tool_use_id"],
            "content": "launched to moon",
            "is_error": False,
        }
    else:
        assert calls == []
        assert (
            result["is_error"] is True and "rejected" in result["content"] and "go/no-go" in result["content"]
        )
    assert cli(["--database-url", module_db, "approve", key]) == 2  # decided once, never twice


def test_a_history_past_the_context_window_fails_once_saying_what_to_do(db, fake) -> None:
    """The API's 400 "prompt is too long": every later turn sends the same history and fails the
    same way, so the run fails on its first request, once, and the error says what to do (it said
    only "refused"; the long-conversation audit)."""
    fake.context_window = 5
    try:
        run = enqueue_agent(db, "A question past five tokens", tools=[], metadata={}, max_attempts=3)
        row = finish(db, run)
    finally:
        fake.context_window = 200_000
    assert row["status"] == "failed" and row["attempt"] == 1, row
    assert "prompt is too long" in row["error"], row["error"]
    assert "no longer fits the model's context window" in row["error"]
    assert "fork_run" in row["error"] and "new conversation" in row["error"]
    assert len(fake.requests) == 1


def test_a_registered_tool_the_run_was_not_offered_does_not_run(db, fake) -> None:
    """The worker's registry holds every tool it has code for; a run offers the model some of
    them. A model turn naming another registered tool had it run (the security audit): now the
    model is told it was not offered, and the tool's code never runs."""
    fake.set_scenario(script(turn(Text("Launching."), ToolCall("launch", {"target": "moon"})), summary))
    run = enqueue_agent(db, "Weather?", tools=[WEATHER], metadata={})  # launch not offered
    row = finish(db, run)
    assert row["status"] == "completed", row
    assert [c for c in calls if c[0] == "launch"] == []
    (result,) = [json.loads(p) for _, kind, p in steps(db, run) if kind == "tool_result"]
    assert result["is_error"] is True
    assert result["content"] == "Unknown tool 'launch': this run was not offered it.", result
