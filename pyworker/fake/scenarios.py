"""What the fake Messages API answers: scripted turns, chosen by how far the conversation has got.

A scenario is a function of the request to the next `Turn`. The `Script` scenarios key the turn on
`step`, the number of assistant messages since the last message a person wrote (a user message that
is not only tool results). A resumed run sends the same history, so it gets the same step and the
same answer: the fake is deterministic in the history, which is what a resume test needs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyworker.fake.faults import Fault


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Thinking:
    """Streamed as thinking_delta chunks, then one signature_delta. Sent only when the request enables
    thinking, like the real API."""

    thinking: str


@dataclass(frozen=True)
class RedactedThinking:
    """An opaque block: its `data` is a MAC the server checks when the block comes back."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    input: Mapping[str, Any]


Block = Text | Thinking | RedactedThinking | ToolCall


@dataclass(frozen=True)
class Turn:
    """One model response. `stop_reason` defaults to tool_use when a tool is called, else end_turn.
    `faults[n]` is applied the (n+1)-th time the server serves this turn for the same history (so a
    retry of the same request gets the next entry; None means serve it normally).
    `server_tool_use`: the server tools the API says the turn ran, reported in its usage as the API
    reports them (e.g. `{"web_search_requests": 50, "web_fetch_requests": 0}`), billed per request."""

    blocks: tuple[Block, ...]
    stop_reason: str | None = None
    stop_details: Mapping[str, Any] | None = None
    faults: tuple[Fault | None, ...] = ()
    server_tool_use: Mapping[str, int] | None = None

    @property
    def resolved_stop_reason(self) -> str:
        if self.stop_reason is not None:
            return self.stop_reason
        return "tool_use" if any(isinstance(b, ToolCall) for b in self.blocks) else "end_turn"


def turn(*blocks: Block, stop_reason: str | None = None, **kwargs: Any) -> Turn:
    return Turn(tuple(blocks), stop_reason=stop_reason, **kwargs)


@dataclass(frozen=True)
class ModelRequest:
    """The parsed request body, as a scenario sees it."""

    body: Mapping[str, Any]
    step: int

    @property
    def messages(self) -> list[Mapping[str, Any]]:
        return list(self.body.get("messages") or [])

    @property
    def tool_names(self) -> list[str]:
        return [t.get("name", "") for t in self.body.get("tools") or [] if isinstance(t, Mapping)]

    @property
    def last_user_text(self) -> str:
        """The text of the last message a person wrote (tool results skipped)."""
        for message in reversed(self.messages):
            if message.get("role") != "user":
                continue
            text = _text_of(message.get("content"))
            if text:
                return text
        return ""

    @property
    def tool_results(self) -> list[Mapping[str, Any]]:
        """Every tool_result block since the last message a person wrote, oldest first."""
        found: list[Mapping[str, Any]] = []
        for message in reversed(self.messages):
            content = message.get("content")
            if message.get("role") != "user" or not isinstance(content, list):
                if message.get("role") == "user":
                    break
                continue
            results = [b for b in content if isinstance(b, Mapping) and b.get("type") == "tool_result"]
            found[:0] = results
            if len(results) != len(content):
                break
        return found


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            b.get("text", "") for b in content if isinstance(b, Mapping) and b.get("type") == "text"
        )
    return ""


def conversation_step(messages: Sequence[Mapping[str, Any]]) -> int:
    """Assistant messages since the last user message that is not only tool results."""
    step = 0
    for message in reversed(messages):
        if message.get("role") == "assistant":
            step += 1
            continue
        content = message.get("content")
        only_results = (
            isinstance(content, list)
            and bool(content)
            and all(isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content)
        )
        if not only_results:
            break
    return step


class Scenario(Protocol):
    def __call__(self, request: ModelRequest) -> Turn: ...


TurnSource = Turn | Callable[[ModelRequest], Turn]


@dataclass(frozen=True)
class Script:
    """turns[step] answers; past the end, `after_end` (a short end_turn text by default)."""

    turns: tuple[TurnSource, ...]
    after_end: Turn = field(default_factory=lambda: turn(Text("(the script has no more turns)")))

    def __call__(self, request: ModelRequest) -> Turn:
        if request.step >= len(self.turns):
            return self.after_end
        source = self.turns[request.step]
        return source(request) if callable(source) else source


def script(*turns: TurnSource) -> Script:
    return Script(tuple(turns))


def _echo(request: ModelRequest) -> Turn:
    said = request.last_user_text or "nothing"
    return turn(Text(f"Hello from the fake model. You said: {said}"))


def _summary(request: ModelRequest) -> Turn:
    results = request.tool_results
    lines = [f"- {r.get('tool_use_id')}: {_text_of(r.get('content'))[:80]}" for r in results]
    return turn(Text("Here is what the tools returned:\n" + "\n".join(lines)))


DEMO_THOUGHT = "The user wants a status report. Step {step}: I should {plan}."


def _demo_step(step: int, plan: str, text: str, *calls: ToolCall) -> TurnSource:
    def build(request: ModelRequest) -> Turn:
        return turn(Thinking(DEMO_THOUGHT.format(step=step, plan=plan)), Text(text), *calls)

    return build


def _demo_summary(request: ModelRequest) -> Turn:
    results = request.tool_results
    errors = sum(1 for r in results if r.get("is_error"))
    return turn(
        Thinking("All steps are done; I will summarise what happened."),
        Text(
            "Done. I listed the workspace, read the notes and the contacts, emailed the status to "
            f"team@example.com and wrote report.md ({len(results)} tool results in the last step, "
            f"{errors} errors)."
        ),
    )


# The demo agent task: tools list_files, read_file, send_email (non-idempotent), write_file.
DEMO_TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": "list_files",
        "description": "List the files under a directory of the workspace.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
    {
        "name": "read_file",
        "description": "Read a text file of the workspace.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
    {
        "name": "send_email",
        "description": "Send an email. Not idempotent: every call sends one more email.",
        "input_schema": {
            "type": "object",
            "properties": {
                "to": {"type": "string"},
                "subject": {"type": "string"},
                "body": {"type": "string"},
            },
            "required": ["to", "subject", "body"],
        },
    },
    {
        "name": "write_file",
        "description": "Write a text file of the workspace (overwrites).",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
)

DEMO_SCRIPT = script(
    _demo_step(
        0,
        "look at the workspace",
        "I'll start by listing the workspace.",
        ToolCall("list_files", {"path": "."}),
    ),
    _demo_step(
        1,
        "read the notes and the contacts",
        "Reading the notes and the contacts.",
        ToolCall("read_file", {"path": "notes/todo.txt"}),
        ToolCall("read_file", {"path": "notes/contacts.txt"}),
    ),
    _demo_step(
        2,
        "email the team",
        "Sending the status email.",
        ToolCall(
            "send_email",
            {
                "to": "team@example.com",
                "subject": "Weekly status",
                "body": "All tasks in notes/todo.txt are on track.",
            },
        ),
    ),
    _demo_step(
        3,
        "write the report",
        "Writing report.md.",
        ToolCall(
            "write_file", {"path": "report.md", "content": "# Status\n\nEmail sent to team@example.com.\n"}
        ),
    ),
    _demo_step(4, "check the result", "Checking the report.", ToolCall("read_file", {"path": "report.md"})),
    _demo_summary,
)

WEATHER_CALLS = (
    ToolCall("get_weather", {"city": "Paris", "unit": "celsius"}),
    ToolCall("get_time", {"timezone": "Europe/Paris"}),
)

LONG_TEXT = " ".join(f"word{i}" for i in range(400))
NUL_TEXT = "Before\x00after: a NUL, 100% \\u0000 (not a NUL) and %00 (not one either)."

SCENARIOS: dict[str, Scenario] = {
    "text": script(_echo),
    "thinking": script(
        turn(Thinking("The user greets me. A short, friendly answer will do."), Text("Hello!"))
    ),
    "redacted_thinking": script(
        turn(
            Thinking("Let me think."),
            RedactedThinking(),
            Text("Here is my answer after some redacted reasoning."),
        )
    ),
    "tool_use": script(
        turn(Text("I'll look that up."), ToolCall("get_weather", {"city": "Paris"})), _summary
    ),
    "parallel_tools": script(turn(Text("Checking both."), *WEATHER_CALLS), _summary),
    "thinking_tools": script(
        turn(Thinking("I need the weather and the time in Paris."), *WEATHER_CALLS),
        turn(Thinking("Both tools answered; I can reply."), Text("It is sunny in Paris.")),
    ),
    "pause_turn": script(
        turn(Text("Searching for a while..."), stop_reason="pause_turn"),
        turn(Text(" Found it: the answer is 42.")),
    ),
    "max_tokens": script(turn(Text(LONG_TEXT), stop_reason="max_tokens")),
    "refusal": script(
        turn(
            Text("I can't help with"),
            stop_reason="refusal",
            stop_details={"type": "refusal", "category": None, "explanation": None},
        )
    ),
    "context_window": script(
        turn(Text("The conversation is getting long and"), stop_reason="model_context_window_exceeded")
    ),
    "demo": DEMO_SCRIPT,
    # U+0000 in what a model produces (the journal and the step log must carry it).
    "nul_text": script(turn(Thinking("A NUL\x00 in my thoughts."), Text(NUL_TEXT))),
    "nul_tool_input": script(
        turn(Text("Reading it."), ToolCall("read_file", {"path": "notes/\x00todo.txt"})), _summary
    ),
}


def scenario_names() -> list[str]:
    return sorted(SCENARIOS)


def resolve_scenario(scenario: str | Scenario) -> Scenario:
    if callable(scenario):
        return scenario
    try:
        return SCENARIOS[scenario]
    except KeyError:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(scenario_names())}") from None


def tool_input_json(call: ToolCall) -> str:
    return json.dumps(dict(call.input), ensure_ascii=False)
