"""The fake Messages API against the real `anthropic` SDK over TCP: wire format, signatures, faults.

What the SDK does on each fault is asserted here, so the agent loop can rely on it:
429/529/500 with retry-after are retried (max_retries) and then raise RateLimitError /
OverloadedError / InternalServerError; an `error` event after a 200 raises a bare APIStatusError with
status_code 200; a connection cut mid-stream raises httpx2.RemoteProtocolError (anthropic before
2.17) or an APIConnectionError caused by it (2.17 and later); neither is retried.
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import json
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import anthropic
import httpx2
import pytest

from pyworker.agent import ratelimit_headers
from pyworker.fake.faults import (
    Fault,
    bad_tool_json,
    drop_connection,
    end_stream,
    error_event,
    garbled,
    overloaded,
    rate_limited,
    server_error,
    slow,
)
from pyworker.fake.ratelimit import RateLimit
from pyworker.fake.scenarios import DEMO_TOOLS, Text, Thinking, ToolCall, script, turn
from pyworker.fake.server import FakeModel

MODEL = "claude-fake-1"
THINKING = {"type": "enabled", "budget_tokens": 1024}
WEATHER_TOOLS = [
    {"name": "get_weather", "description": "Weather in a city.", "input_schema": {"type": "object"}},
    {"name": "get_time", "description": "Time in a zone.", "input_schema": {"type": "object"}},
]


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    with FakeModel("text") as server:
        yield server


_clients: weakref.WeakKeyDictionary[FakeModel, anthropic.Anthropic] = weakref.WeakKeyDictionary()


def client_for(fake: FakeModel) -> anthropic.Anthropic:
    """One client per server (building one costs ~0.1 s); max_retries=2, the SDK's default."""
    if fake not in _clients:
        _clients[fake] = anthropic.Anthropic(base_url=fake.base_url, api_key="test", max_retries=2)
    return _clients[fake]


@contextlib.contextmanager
def dropped_mid_stream() -> Iterator[None]:
    """What the SDK raises for a stream whose connection is cut mid-body: the transport's
    RemoteProtocolError itself before anthropic 2.17, an APIConnectionError caused by it since
    (pyworker.agent.model reads both as "model stream broken mid-response")."""
    with pytest.raises((httpx2.RemoteProtocolError, anthropic.APIConnectionError)) as raised:
        yield
    cause = raised.value if isinstance(raised.value, httpx2.RemoteProtocolError) else raised.value.__cause__
    assert isinstance(cause, httpx2.RemoteProtocolError), repr(raised.value)
    assert "incomplete chunked read" in str(cause)


def hello(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 256, "messages": [{"role": "user", "content": "hi"}], **extra}


def raw_post(
    fake: FakeModel, path: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict, Any]:
    """A request without the SDK (so the SDK's own client-side checks do not get in the way)."""
    conn = http.client.HTTPConnection(fake.host, fake.port, timeout=10)
    default = {"x-api-key": "test", "anthropic-version": "2023-06-01", "content-type": "application/json"}
    conn.request("POST", path, body=json.dumps(body), headers={**default, **(headers or {})})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    parsed = (
        json.loads(data) if response.getheader("content-type", "").startswith("application/json") else data
    )
    return response.status, {k.lower(): v for k, v in response.getheaders()}, parsed


# -- wire format --------------------------------------------------------------------------------


def test_streaming_text_arrives_and_matches_final_message(fake: FakeModel) -> None:
    with client_for(fake).messages.stream(**hello()) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
        request_id = stream.request_id
    assert len(pieces) > 1, "the text must arrive in several deltas"
    assert "".join(pieces) == final.content[0].text == "Hello from the fake model. You said: hi"
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 1 and final.usage.input_tokens > 0
    [recorded] = fake.requests
    assert request_id == recorded.request_id and request_id.startswith("req_")
    assert recorded.body["stream"] is True and recorded.headers["authorization"] == "Bearer test"


def test_non_streaming_create_returns_the_message_and_request_id(fake: FakeModel) -> None:
    message = client_for(fake).messages.create(**hello())
    assert message.content[0].text == "Hello from the fake model. You said: hi"
    assert message.stop_reason == "end_turn" and message.role == "assistant" and message.id.startswith("msg_")
    assert message._request_id == fake.requests[0].request_id


def test_raw_stream_is_chunked_sse_in_the_api_order(fake: FakeModel) -> None:
    fake.set_scenario("tool_use")
    status, headers, body = raw_post(fake, "/v1/messages", hello(stream=True, tools=WEATHER_TOOLS))
    assert status == 200
    assert headers["transfer-encoding"] == "chunked"
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["request-id"].startswith("req_")
    events = [
        (
            frame.split("\n")[0].removeprefix("event: "),
            json.loads(frame.split("\n")[1].removeprefix("data: ")),
        )
        for frame in body.decode().strip().split("\n\n")
    ]
    names = [name for name, _ in events]
    assert all(data["type"] == name for name, data in events)
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") == 2
    json_deltas = [
        d["delta"]["partial_json"] for n, d in events if n == "content_block_delta" and d["index"] == 1
    ]
    assert json_deltas[0] == "" and len(json_deltas) > 2
    assert json.loads("".join(json_deltas)) == {"city": "Paris"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_parallel_tool_calls_stream_their_input_json(fake: FakeModel) -> None:
    fake.set_scenario("parallel_tools")
    with client_for(fake).messages.stream(**hello(tools=WEATHER_TOOLS)) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds
    calls = [(b.name, b.input) for b in final.content if b.type == "tool_use"]
    assert calls == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}),
        ("get_time", {"timezone": "Europe/Paris"}),
    ]
    assert final.stop_reason == "tool_use"


async def test_async_client_and_async_context_manager() -> None:
    async with FakeModel("thinking") as fake:
        client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test")
        async with client.messages.stream(**hello(max_tokens=2048, thinking=THINKING)) as stream:
            final = await stream.get_final_message()
        await client.close()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].signature


def test_thinking_blocks_only_when_the_request_enables_thinking(fake: FakeModel) -> None:
    fake.set_scenario("thinking")
    plain = client_for(fake).messages.create(**hello())
    assert [b.type for b in plain.content] == ["text"]


def test_count_tokens(fake: FakeModel) -> None:
    counted = client_for(fake).messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    assert counted.input_tokens > 0


# -- thinking signatures ------------------------------------------------------------------------


def first_turn(
    fake: FakeModel, scenario: str = "thinking_tools"
) -> tuple[dict[str, Any], anthropic.types.Message]:
    fake.set_scenario(scenario)
    request = hello(max_tokens=4096, thinking=THINKING, tools=WEATHER_TOOLS, system="You are terse.")
    request["messages"] = [{"role": "user", "content": "Weather and time in Paris?"}]
    with client_for(fake).messages.stream(**request) as stream:
        message = stream.get_final_message()
    return request, message


def second_request(request: dict[str, Any], content: list[dict[str, Any]]) -> dict[str, Any]:
    results = [
        {"type": "tool_result", "tool_use_id": b["id"], "content": f"{b['name']}: ok"}
        for b in content
        if b["type"] == "tool_use"
    ]
    return {
        **request,
        "messages": [
            *request["messages"],
            {"role": "assistant", "content": content},
            {"role": "user", "content": results},
        ],
    }


@pytest.mark.parametrize("dump", ["exclude_none", "full", "raw_wire_json"])
def test_thinking_round_trip_is_accepted(fake: FakeModel, dump: str) -> None:
    request, message = first_turn(fake)
    assert [b.type for b in message.content] == ["thinking", "tool_use", "tool_use"]
    if dump == "exclude_none":
        content = [b.model_dump(exclude_none=True) for b in message.content]
    elif dump == "full":
        content = [b.model_dump() for b in message.content]  # nulls included: same meaning
    else:
        content = json.loads(json.dumps(fake.requests[0].response["content"]))
    reply = client_for(fake).messages.create(**second_request(request, content))
    assert reply.content[-1].text == "It is sunny in Paris."
    # And the next turn, carrying both signed blocks, is accepted as well.
    third = second_request(request, content)
    third["messages"] += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
        {"role": "user", "content": "thanks"},
    ]
    # a new human message starts the script over: a tool call again
    assert client_for(fake).messages.create(**third).stop_reason == "tool_use"


def test_signatures_cover_meaning_not_serialization(fake: FakeModel) -> None:
    """Signed over a history sent with nulls and string content; verified over the same history sent
    without nulls, with content as text blocks and with cache_control added."""
    request, message = first_turn(fake)
    follow_up = second_request(request, [b.model_dump() for b in message.content])
    assert follow_up["messages"][1]["content"][1]["caller"] is None
    reply = client_for(fake).messages.create(**follow_up)
    resumed = second_request(request, [b.model_dump(exclude_none=True) for b in message.content])
    resumed["messages"][0]["content"] = [
        {"type": "text", "text": "Weather and time in Paris?", "cache_control": {"type": "ephemeral"}}
    ]
    resumed["system"] = [{"type": "text", "text": "You are terse."}]
    resumed["messages"] += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
        {"role": "user", "content": "thanks"},
    ]
    client_for(fake).messages.create(**resumed)
    resumed["messages"][0]["content"][0]["text"] += " "
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.1\.content\.0: Invalid `signature`"):
        client_for(fake).messages.create(**resumed)


def _flip(text: str) -> str:
    return text[:-1] + ("A" if text[-1] != "A" else "B")


TAMPERINGS = {
    "thinking_text": lambda r: r["messages"][1]["content"][0].update(
        thinking=r["messages"][1]["content"][0]["thinking"] + "."
    ),
    "signature": lambda r: r["messages"][1]["content"][0].update(
        signature=_flip(r["messages"][1]["content"][0]["signature"])
    ),
    "earlier_user_message": lambda r: r["messages"][0].update(content="Weather and time in Paris!"),
    "system_prompt": lambda r: r.update(system="You are terse!"),
    "tool_definition": lambda r: r["tools"][0].update(description="Weather in a town."),
    "model": lambda r: r.update(model="claude-fake-2"),
}


@pytest.mark.parametrize("change", sorted(TAMPERINGS))
def test_altered_history_is_refused_with_invalid_signature(fake: FakeModel, change: str) -> None:
    request, message = first_turn(fake)
    follow_up = json.loads(
        json.dumps(second_request(request, [b.model_dump(exclude_none=True) for b in message.content]))
    )
    client_for(fake).messages.create(**follow_up)  # untouched: accepted
    TAMPERINGS[change](follow_up)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client_for(fake).messages.create(**follow_up)
    assert caught.value.status_code == 400
    assert caught.value.type == "invalid_request_error"
    assert caught.value.api_message == "messages.1.content.0: Invalid `signature` in `thinking` block"
    assert caught.value.request_id == fake.requests[-1].request_id


def test_a_block_signed_later_binds_the_blocks_before_it(fake: FakeModel) -> None:
    """Tool inputs of an earlier turn are part of a later thinking block's history."""
    request, message = first_turn(fake)
    follow_up = second_request(request, [b.model_dump(exclude_none=True) for b in message.content])
    reply = client_for(fake).messages.create(**follow_up)
    follow_up["messages"] += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
        {"role": "user", "content": "thanks"},
    ]
    follow_up["messages"][1]["content"][1]["input"] = {"city": "Lyon", "unit": "celsius"}
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.3\.content\.0: Invalid `signature`"):
        client_for(fake).messages.create(**follow_up)


def test_signatures_from_another_server_secret_are_refused(fake: FakeModel) -> None:
    request, message = first_turn(fake)
    follow_up = second_request(request, [b.model_dump(exclude_none=True) for b in message.content])
    with FakeModel("thinking_tools", secret=b"another key") as other:
        with pytest.raises(anthropic.BadRequestError, match="Invalid `signature`"):
            client_for(other).messages.create(**follow_up)


def test_the_same_history_gets_the_same_answer(fake: FakeModel) -> None:
    _, message = first_turn(fake)
    _, again = first_turn(fake)
    assert [b.model_dump() for b in again.content] == [b.model_dump() for b in message.content]


def test_redacted_thinking_round_trip_and_tampering(fake: FakeModel) -> None:
    request, message = first_turn(fake, "redacted_thinking")
    assert [b.type for b in message.content] == ["thinking", "redacted_thinking", "text"]
    content = [b.model_dump(exclude_none=True) for b in message.content]
    follow_up = {
        **request,
        "messages": [
            *request["messages"],
            {"role": "assistant", "content": content},
            {"role": "user", "content": "ok"},
        ],
    }
    client_for(fake).messages.create(**follow_up)
    follow_up["messages"][1]["content"][1]["data"] = _flip(content[1]["data"][:-2]) + "=="
    with pytest.raises(anthropic.BadRequestError) as caught:
        client_for(fake).messages.create(**follow_up)
    assert caught.value.api_message == "messages.1.content.1: Invalid `data` in `redacted_thinking` block"


def test_a_loop_that_drops_thinking_blocks_is_refused(fake: FakeModel) -> None:
    request, message = first_turn(fake)
    without = [b.model_dump(exclude_none=True) for b in message.content if b.type != "thinking"]
    with pytest.raises(anthropic.BadRequestError, match="Expected `thinking` or `redacted_thinking`"):
        client_for(fake).messages.create(**second_request(request, without))


# -- stop reasons -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scenario, stop_reason",
    [
        ("pause_turn", "pause_turn"),
        ("max_tokens", "max_tokens"),
        ("refusal", "refusal"),
        ("context_window", "model_context_window_exceeded"),
    ],
)
@pytest.mark.parametrize("streaming", [True, False])
def test_stop_reasons_arrive(fake: FakeModel, scenario: str, stop_reason: str, streaming: bool) -> None:
    fake.set_scenario(scenario)
    if streaming:
        with client_for(fake).messages.stream(**hello()) as stream:
            message = stream.get_final_message()
    else:
        message = client_for(fake).messages.create(**hello())
    assert message.stop_reason == stop_reason
    assert message.content and message.content[0].type == "text"
    if scenario == "refusal":
        assert message.stop_details is not None and message.stop_details.type == "refusal"


def test_a_turn_reports_its_server_tool_requests_in_usage() -> None:
    """As the API: usage.server_tool_use counts the server-tool requests a turn ran (billed per
    request), in the message and in the stream's message_delta, which the SDK keeps in the
    final message; a turn that ran none reports no server_tool_use."""
    ran = {"web_search_requests": 50, "web_fetch_requests": 2}
    with FakeModel(lambda request: turn(Text("found it"), server_tool_use=ran)) as fake:
        message = client_for(fake).messages.create(**hello())
        assert message.usage.server_tool_use is not None
        assert message.usage.server_tool_use.to_dict() == ran
        with client_for(fake).messages.stream(**hello()) as stream:
            deltas = [e.usage for e in stream if e.type == "message_delta"]
            final = stream.get_final_message()
        assert deltas[0].server_tool_use is not None and deltas[0].server_tool_use.to_dict() == ran
        assert final.usage.server_tool_use is not None
        assert final.usage.server_tool_use.web_search_requests == 50
    with FakeModel("text") as plain:
        assert client_for(plain).messages.create(**hello()).usage.server_tool_use is None


def test_output_is_cut_at_max_tokens(fake: FakeModel) -> None:
    with client_for(fake).messages.stream(**hello(max_tokens=3)) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "max_tokens"
    assert message.content[0].text == "Hello from t"
    assert message.usage.output_tokens == 3


def test_context_window_fills_up_then_refuses() -> None:
    with FakeModel("text", context_window=15) as fake:
        message = client_for(fake).messages.create(**hello(max_tokens=100))
        assert message.stop_reason == "model_context_window_exceeded"
        assert 0 < len(message.content[0].text) < len("Hello from the fake model. You said: hi")
        long = hello(messages=[{"role": "user", "content": "x" * 400}])
        with pytest.raises(anthropic.BadRequestError, match=r"prompt is too long: \d+ tokens > 15 maximum"):
            client_for(fake).messages.create(**long)


def test_pause_turn_continues_when_the_content_is_sent_back(fake: FakeModel) -> None:
    fake.set_scenario("pause_turn")
    paused = client_for(fake).messages.create(**hello())
    content = [b.model_dump(exclude_none=True) for b in paused.content]
    request = hello()
    request["messages"].append({"role": "assistant", "content": content})
    resumed = client_for(fake).messages.create(**request)
    assert resumed.stop_reason == "end_turn"
    assert resumed.content[0].text == " Found it: the answer is 42."


def test_a_paused_turn_is_continued_in_the_same_assistant_message() -> None:
    """The contract for pause_turn: send the paused content back as the last assistant message; the
    answer continues that message, and its blocks are signed as its continuation, so the loop merges
    them into it (a second assistant message in a row is refused)."""
    paused = script(
        turn(Thinking("Start searching."), Text("Searching..."), stop_reason="pause_turn"),
        turn(Thinking("Found it."), Text(" The answer is 42.")),
    )
    with FakeModel(paused) as fake:
        request = hello(max_tokens=2048, thinking=THINKING)
        first = client_for(fake).messages.create(**request)
        assert first.stop_reason == "pause_turn"
        merged = [b.model_dump(exclude_none=True) for b in first.content]
        request["messages"].append({"role": "assistant", "content": merged})
        second = client_for(fake).messages.create(**request)
        assert second.stop_reason == "end_turn"
        merged = merged + [b.model_dump(exclude_none=True) for b in second.content]
        request["messages"][1] = {"role": "assistant", "content": merged}
        request["messages"].append({"role": "user", "content": "thanks"})
        client_for(fake).messages.create(**request)  # accepted: every signature verifies
        request["messages"][1:2] = [
            {"role": "assistant", "content": merged[:2]},
            {"role": "assistant", "content": merged[2:]},
        ]
        with pytest.raises(anthropic.BadRequestError, match='multiple "assistant" roles in a row'):
            client_for(fake).messages.create(**request)


def test_a_restarted_fake_model_accepts_its_earlier_signatures(fake: FakeModel) -> None:
    """The default key is fixed, so a resumed run survives a restart of `runrow fake-model`."""
    request, message = first_turn(fake)
    follow_up = second_request(request, [b.model_dump(exclude_none=True) for b in message.content])
    with FakeModel("thinking_tools") as restarted:
        assert client_for(restarted).messages.create(**follow_up).content[-1].text == "It is sunny in Paris."


# -- request validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, message",
    [
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens: Field required"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}, "model: Field required"),
        ({"model": MODEL, "max_tokens": 5}, "messages: Field required"),
        (hello(messages=[{"role": "assistant", "content": "hi"}]), 'first message must use the "user" role'),
        (
            hello(messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]),
            'roles must alternate between "user" and "assistant", but found multiple "user" roles in a row',
        ),
        (
            hello(
                messages=[
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": "b"},
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "c"}],
                    },
                ]
            ),
            "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_x",
        ),
        (
            hello(
                messages=[
                    {"role": "user", "content": "a"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "toolu_y", "name": "t", "input": {}}],
                    },
                    {"role": "user", "content": "no result"},
                ]
            ),
            "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_y",
        ),
        (
            hello(
                messages=[{"role": "user", "content": [{"type": "text", "text": "a", "parsed_output": None}]}]
            ),
            "messages.0.content.0.text.parsed_output: Extra inputs are not permitted",
        ),
        (hello(tools=[{"name": "get weather", "input_schema": {"type": "object"}}]), "tools.0.custom.name"),
        (hello(tools=[{"name": "t"}]), "tools.0.custom.input_schema: Field required"),
        (
            hello(tools=[{"name": "t", "input_schema": {"type": "string"}}]),
            "tools.0.custom.input_schema.type",
        ),
        (
            hello(tools=[{"name": "t", "input_schema": {"type": "object"}}] * 2),
            "tools: Tool names must be unique.",
        ),
        (
            hello(messages=[{"role": "user", "content": " \n"}]),
            "text content blocks must contain non-whitespace text",
        ),
        (
            hello(
                messages=[
                    {"role": "user", "content": "a"},
                    {
                        "role": "assistant",
                        "content": [{"type": "text", "text": " "}, {"type": "text", "text": "\t"}],
                    },
                    {"role": "user", "content": "b"},
                ]
            ),
            "text content blocks must contain non-whitespace text",
        ),
        (hello(thinking={"type": "enabled", "budget_tokens": 100}), "budget_tokens: Input should be greater"),
        (
            hello(max_tokens=1024, thinking={"type": "enabled", "budget_tokens": 1024}),
            "`max_tokens` must be greater than `thinking.budget_tokens`.",
        ),
    ],
)
def test_invalid_requests_get_400_with_a_clear_message(fake: FakeModel, body: dict, message: str) -> None:
    status, headers, error = raw_post(fake, "/v1/messages", body)
    assert status == 400
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert message in error["error"]["message"]
    assert error["request_id"] == headers["request-id"]


def test_white_space_beside_other_text_is_taken(fake: FakeModel) -> None:
    """As the API: a message of white-space text only is refused, white space beside text is not."""
    body = hello(
        messages=[{"role": "user", "content": [{"type": "text", "text": " "}, {"type": "text", "text": "x"}]}]
    )
    status, _, _ = raw_post(fake, "/v1/messages", body)
    assert status == 200


def test_bad_alternation_through_the_sdk_is_a_bad_request_error(fake: FakeModel) -> None:
    request = hello(messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    with pytest.raises(anthropic.BadRequestError, match="roles must alternate"):
        client_for(fake).messages.create(**request)
    with FakeModel("text", merge_consecutive=True) as merging:
        assert client_for(merging).messages.create(**request).stop_reason == "end_turn"


def test_authentication_and_version_headers(fake: FakeModel) -> None:
    status, _, error = raw_post(fake, "/v1/messages", hello(), {"x-api-key": ""})
    assert (status, error["error"]["type"]) == (401, "authentication_error")
    status, _, error = raw_post(fake, "/v1/messages", hello(), {"anthropic-version": ""})
    assert (status, error["error"]["message"]) == (400, "anthropic-version: header is required")
    with FakeModel("text", api_key="right") as strict:
        with pytest.raises(anthropic.AuthenticationError):
            client_for(strict).messages.create(**hello())
    status, _, error = raw_post(fake, "/v1/nothing", hello())
    assert (status, error["error"]["type"]) == (404, "not_found_error")


# -- faults -------------------------------------------------------------------------------------


@pytest.mark.parametrize("first, second", [(rate_limited, overloaded), (overloaded, server_error)])
def test_retryable_statuses_are_retried_and_the_third_request_succeeds(
    fake: FakeModel, first, second
) -> None:
    fake.inject(first(0.01), second(0.01))
    started = time.monotonic()
    message = client_for(fake).messages.create(**hello())
    elapsed = time.monotonic() - started
    assert message.stop_reason == "end_turn"
    assert [r.status for r in fake.requests] == [first(0).status, second(0).status, 200]
    assert [r.headers["x-stainless-retry-count"] for r in fake.requests] == ["0", "1", "2"]
    # retry-after-ms (10 ms) was honoured: the SDK's own backoff would sleep at least 0.375 + 0.75 s
    assert elapsed < 1.0


def test_retry_after_headers_are_sent(fake: FakeModel) -> None:
    fake.inject(rate_limited(1.5))
    status, headers, error = raw_post(fake, "/v1/messages", hello())
    assert status == 429 and error["error"]["type"] == "rate_limit_error"
    assert headers["retry-after"] == "2" and headers["retry-after-ms"] == "1500"


def test_a_rate_limit_states_its_bucket_in_every_answer_like_the_api() -> None:
    """limit, remaining (after this request), reset (RFC 3339, when the bucket is full again)
    and date, on the answers and on the 429; the worker reads them
    (pyworker/agent/ratelimit_headers.py). Streamed and not."""
    limit = RateLimit(requests=2, per_seconds=60.0)
    with FakeModel("text", rate_limit=limit) as fake:
        with client_for(fake).messages.stream(**hello()) as stream:
            streamed = stream.response.headers
            stream.get_final_message()
        _, answered, _ = raw_post(fake, "/v1/messages", hello())
        status, refused, _ = raw_post(fake, "/v1/messages", hello())
    prefix = "anthropic-ratelimit-requests-"
    assert [(h[prefix + "limit"], h[prefix + "remaining"]) for h in (streamed, answered, refused)] == [
        ("2", "1"),
        ("2", "0"),
        ("2", "0"),
    ]
    assert status == 429 and refused["retry-after"] in ("30", "31")
    for headers in (streamed, answered, refused):
        date = email.utils.parsedate_to_datetime(headers["date"])
        reset = datetime.fromisoformat(headers[prefix + "reset"])
        # Full again in a minute at most (rounded up to the second; date is truncated).
        assert 0 < (reset - date).total_seconds() <= 62, (headers["date"], headers[prefix + "reset"])
    wait = ratelimit_headers.exhausted(refused)
    # 2 a minute: one request back half a minute after the bucket emptied.
    assert wait is not None and wait.bucket == "requests" and 29 <= wait.seconds <= 31
    assert ratelimit_headers.exhausted(streamed) is None  # one left: nothing to block


def test_every_answer_has_a_date(fake: FakeModel) -> None:
    _, headers, _ = raw_post(fake, "/v1/messages", hello())
    _, missing, _ = raw_post(fake, "/v1/nothing", hello())
    for h in (headers, missing):
        assert email.utils.parsedate_to_datetime(h["date"]).tzinfo is not None
    assert not any(name.startswith("anthropic-ratelimit-") for name in headers)  # no limit, no headers


@pytest.mark.parametrize(
    "fault, error_class, status",
    [
        (rate_limited, anthropic.RateLimitError, 429),
        (overloaded, anthropic.OverloadedError, 529),
        (server_error, anthropic.InternalServerError, 500),
    ],
)
def test_beyond_the_retries_the_status_error_is_raised(
    fake: FakeModel, fault, error_class, status: int
) -> None:
    fake.inject(fault(0.01), fault(0.01), fault(0.01), None)
    with pytest.raises(error_class) as caught:
        with client_for(fake).messages.stream(**hello()) as stream:
            stream.get_final_message()
    assert isinstance(caught.value, anthropic.APIStatusError)
    assert caught.value.status_code == status
    assert caught.value.request_id == fake.requests[-1].request_id
    assert fake.request_count == 3  # the first try and max_retries=2


def test_error_event_after_200_is_an_api_status_error_with_status_200_not_retried(fake: FakeModel) -> None:
    fake.inject(error_event(after_events=5))
    seen: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        with client_for(fake).messages.stream(**hello()) as stream:
            for event in stream:
                seen.append(event.type)
    assert type(caught.value) is anthropic.APIStatusError
    assert caught.value.status_code == 200
    assert caught.value.type == "overloaded_error"
    assert caught.value.request_id == fake.requests[0].request_id
    assert seen[0] == "message_start" and "text" in seen, "the events before the error were delivered"
    assert fake.request_count == 1
    assert fake.requests[0].outcome == "error_event"


def test_dropped_connection_mid_stream_is_a_protocol_error_not_retried(fake: FakeModel) -> None:
    fake.inject(drop_connection(after_events=5))
    with dropped_mid_stream():
        with client_for(fake).messages.stream(**hello()) as stream:
            stream.get_final_message()
    assert fake.request_count == 1
    assert fake.requests[0].outcome == "dropped"


async def test_dropped_connection_mid_stream_async(fake: FakeModel) -> None:
    fake.inject(drop_connection(after_events=2))
    client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test")
    with dropped_mid_stream():
        async with client.messages.stream(**hello()) as stream:
            await stream.get_final_message()
    await client.close()
    assert fake.request_count == 1


def test_a_stream_ended_cleanly_before_message_stop_raises_nothing_in_the_sdk(fake: FakeModel) -> None:
    """What a proxy closing an SSE body gracefully does to the SDK: no error, and a final message
    that is the snapshot so far, stop_reason None, a tool_use's input partially parsed
    (pyworker.agent.model must see the missing message_stop itself)."""
    fake.set_scenario(script(turn(ToolCall("get_weather", {"city": "Paris", "unit": "fahrenheit"}))))
    fake.inject(end_stream(after_events=6))
    with client_for(fake).messages.stream(**hello(tools=WEATHER_TOOLS)) as stream:
        seen = [event.type for event in stream]
        final = stream.get_final_message()
    assert "message_stop" not in seen and "message_delta" not in seen
    assert final.stop_reason is None
    [block] = final.content
    assert block.type == "tool_use" and block.input == {"city": "Paris"}
    assert fake.request_count == 1 and fake.requests[0].outcome == "ended_early"


def test_a_tool_input_that_is_not_json_is_a_value_error_in_the_sdk(fake: FakeModel) -> None:
    """The SDK parses a tool_use's input as it streams, and raises a bare ValueError (worded as
    pyworker.agent.model.TOOL_JSON_ERROR, the JSON so far after TOOL_JSON_AT) at the delta that
    breaks it: no APIError, not retried."""
    from pyworker.agent.model import TOOL_JSON_AT, TOOL_JSON_ERROR

    fake.set_scenario(script(turn(ToolCall("get_weather", {"city": "Oslo"}))))
    fake.inject(bad_tool_json('{"city": Oslo}'))
    with pytest.raises(ValueError) as caught:
        with client_for(fake).messages.stream(**hello(tools=WEATHER_TOOLS)) as stream:
            stream.get_final_message()
    assert not isinstance(caught.value, anthropic.APIError)
    message = str(caught.value)
    assert message.startswith(TOOL_JSON_ERROR) and message.endswith(TOOL_JSON_AT + '{"city": Osl'), message
    assert fake.request_count == 1 and fake.requests[0].outcome == "ok"


def test_an_event_that_is_not_json_is_a_decode_error_in_the_sdk(fake: FakeModel) -> None:
    fake.inject(garbled(after_events=4))
    with pytest.raises(json.JSONDecodeError):
        with client_for(fake).messages.stream(**hello()) as stream:
            stream.get_final_message()
    assert fake.request_count == 1 and fake.requests[0].outcome == "garbled"


@pytest.mark.parametrize("streaming", [True, False])
def test_output_stops_at_the_first_stop_sequence_met(fake: FakeModel, streaming: bool) -> None:
    """As the API: the text up to the sequence (left out), stop_reason stop_sequence, and
    `stop_sequence` saying which one."""
    fake.set_scenario(script(turn(Text("one two three four"), ToolCall("get_weather", {"city": "Oslo"}))))
    request = hello(tools=WEATHER_TOOLS, stop_sequences=["four", "two"])
    if streaming:
        with client_for(fake).messages.stream(**request) as stream:
            message = stream.get_final_message()
    else:
        message = client_for(fake).messages.create(**request)
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "two")
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [("text", "one ")]
    unmet = client_for(fake).messages.create(**hello(tools=WEATHER_TOOLS, stop_sequences=["nowhere"]))
    assert (unmet.stop_reason, unmet.stop_sequence) == ("tool_use", None)
    assert [b.type for b in unmet.content] == ["text", "tool_use"]


def test_a_forcing_tool_choice_makes_the_answer_a_tool_call(fake: FakeModel) -> None:
    """As the API: `any` / `tool` prefill the answer so that it is a tool call (the named one),
    with no text before it, whatever the model would have said; `auto` leaves it to the model."""
    fake.set_scenario(script(turn(Text("It is sunny."))))
    client = client_for(fake)
    forced = client.messages.create(**hello(tools=WEATHER_TOOLS, tool_choice={"type": "any"}))
    assert forced.stop_reason == "tool_use" and [b.type for b in forced.content] == ["tool_use"]
    assert forced.content[0].name == "get_weather"
    named = client.messages.create(
        **hello(tools=WEATHER_TOOLS, tool_choice={"type": "tool", "name": "get_time"})
    )
    assert named.stop_reason == "tool_use" and [b.name for b in named.content] == ["get_time"]
    free = client.messages.create(**hello(tools=WEATHER_TOOLS, tool_choice={"type": "auto"}))
    assert free.stop_reason == "end_turn" and [b.type for b in free.content] == ["text"]


def test_tool_choice_without_parallel_calls_and_none(fake: FakeModel) -> None:
    both = turn(Text("Checking."), ToolCall("get_weather", {}), ToolCall("get_time", {}))
    fake.set_scenario(script(both))
    client = client_for(fake)
    one = client.messages.create(
        **hello(tools=WEATHER_TOOLS, tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    )
    assert [b.type for b in one.content] == ["text", "tool_use"] and one.stop_reason == "tool_use"
    forced = client.messages.create(
        **hello(tools=WEATHER_TOOLS, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    )
    assert [b.name for b in forced.content] == ["get_weather"]
    none = client.messages.create(**hello(tools=WEATHER_TOOLS, tool_choice={"type": "none"}))
    assert [b.type for b in none.content] == ["text"] and none.stop_reason == "end_turn"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"tool_choice": {"type": "any"}}, "tool_choice may only be specified while providing tools"),
        ({"tools": WEATHER_TOOLS, "tool_choice": {"type": "sometimes"}}, "tool_choice: Input tag"),
        ({"tools": WEATHER_TOOLS, "tool_choice": {"type": "tool", "name": "x"}}, "Tool 'x' not found"),
        (
            {
                "tools": WEATHER_TOOLS,
                "tool_choice": {"type": "any"},
                "thinking": THINKING,
                "max_tokens": 2048,
            },
            "Thinking may not be enabled when tool_choice forces tool use.",
        ),
    ],
    ids=["no-tools", "bad-type", "unknown-tool", "with-thinking"],
)
def test_a_tool_choice_the_api_refuses(fake: FakeModel, extra: dict[str, Any], message: str) -> None:
    with pytest.raises(anthropic.BadRequestError, match=message):
        client_for(fake).messages.create(**hello(**extra))


def test_dropped_connection_before_the_response_is_retried(fake: FakeModel) -> None:
    fake.inject(drop_connection())
    assert client_for(fake).messages.create(**hello()).stop_reason == "end_turn"
    assert [r.outcome for r in fake.requests] == ["dropped", "ok"]


def test_slow_stream_delays_every_event(fake: FakeModel) -> None:
    fake.inject(slow(0.02))
    started = time.monotonic()
    with client_for(fake).messages.stream(**hello()) as stream:
        events = list(stream)
        stream.get_final_message()
    elapsed = time.monotonic() - started
    raw_events = sum(1 for e in events if e.type != "text")  # `text` events are SDK sugar
    assert elapsed >= 0.02 * raw_events


def test_a_client_closing_the_stream_is_recorded(fake: FakeModel) -> None:
    fake.inject(slow(0.02))
    with client_for(fake).messages.stream(**hello()) as stream:
        next(iter(stream))
    [record] = fake.wait_for_requests(1)
    assert record.outcome == "client_closed"


def test_turn_faults_fire_per_serving_of_the_same_history() -> None:
    flaky = script(turn(Text("steady"), faults=(error_event(after_events=1), None)))
    with FakeModel(flaky) as fake:
        with pytest.raises(anthropic.APIStatusError):
            with client_for(fake).messages.stream(**hello()) as stream:
                stream.get_final_message()
        with client_for(fake).messages.stream(**hello()) as stream:
            assert stream.get_final_message().content[0].text == "steady"


def test_control_endpoints(fake: FakeModel) -> None:
    faults = [rate_limited(0.01).to_json(), None, drop_connection(2).to_json()]
    status, _, answer = raw_post(fake, "/_control/faults", {"faults": faults})
    assert status == 200 and answer == {"queued": 3}
    client_for(fake).messages.create(**hello())  # 429, then served
    with dropped_mid_stream():
        with client_for(fake).messages.stream(**hello()) as stream:
            stream.get_final_message()
    conn = http.client.HTTPConnection(fake.host, fake.port)
    conn.request("GET", "/_control/requests")
    listing = json.loads(conn.getresponse().read())
    conn.close()
    assert [r["outcome"] for r in listing["requests"]] == ["error", "ok", "dropped"]
    assert listing["requests"][0]["fault"]["status"] == 429
    assert raw_post(fake, "/_control/scenario", {"scenario": "refusal"})[2] == {"scenario": "refusal"}
    assert client_for(fake).messages.create(**hello()).stop_reason == "refusal"
    raw_post(fake, "/_control/reset", {})
    assert fake.request_count == 0
    assert Fault.from_json(faults[0]) == rate_limited(0.01)


def test_scenario_header_overrides_the_server_scenario(fake: FakeModel) -> None:
    message = client_for(fake).messages.create(**hello(), extra_headers={"x-fake-scenario": "max_tokens"})
    assert message.stop_reason == "max_tokens"


# -- the demo agent task --------------------------------------------------------------------------


def test_demo_scenario_runs_several_tool_steps_to_a_summary() -> None:
    with FakeModel("demo") as fake:
        client = client_for(fake)
        request = hello(max_tokens=4096, thinking=THINKING, tools=list(DEMO_TOOLS))
        request["messages"] = [{"role": "user", "content": "Send the weekly status."}]
        steps: list[list[str]] = []
        for _ in range(10):
            with client.messages.stream(**request) as stream:
                message = stream.get_final_message()
            content = [b.model_dump(exclude_none=True) for b in message.content]
            request["messages"].append({"role": "assistant", "content": content})
            if message.stop_reason != "tool_use":
                break
            calls = [b for b in content if b["type"] == "tool_use"]
            steps.append([c["name"] for c in calls])
            request["messages"].append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": c["id"], "content": "ok"} for c in calls
                    ],
                }
            )
    assert steps == [
        ["list_files"],
        ["read_file", "read_file"],
        ["send_email"],
        ["write_file"],
        ["read_file"],
    ]
    assert message.stop_reason == "end_turn" and message.content[-1].text.startswith("Done.")
    assert fake.request_count == 6


def test_custom_scripts_call_tools_by_step() -> None:
    echo_tools = script(
        turn(ToolCall("get_time", {"timezone": "UTC"})), lambda req: turn(Text(f"step {req.step}"))
    )
    with FakeModel(echo_tools) as fake:
        first = client_for(fake).messages.create(**hello(tools=WEATHER_TOOLS))
        request = hello(tools=WEATHER_TOOLS)
        request["messages"] += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": first.content[0].id, "content": "12:00"}],
            },
        ]
        assert client_for(fake).messages.create(**request).content[0].text == "step 1"


# -- the command ----------------------------------------------------------------------------------


def test_runrow_fake_model_command_serves_until_sigterm() -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pyworker",
            "fake-model",
            "--port",
            "0",
            "--scenario",
            "text",
            "--delta-delay",
            "0.001",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        base_url = process.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:")
        client = anthropic.Anthropic(base_url=base_url, api_key="test")
        assert client.messages.create(**hello()).content[0].text.endswith("You said: hi")
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
