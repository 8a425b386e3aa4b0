"""Rebuild a run's model input from the step log, and say what the run does next.

The request is rebuilt from `runrow.conversation_history` on every step, not only after a crash,
so the resume path is the path every run takes. Each stored payload is parsed with `json.loads`
(dict order kept) and sent back unchanged: the bytes the SDK produced are the bytes the model
sees again, which signed thinking blocks require.

Next action, from this run's own steps:
- a tool_use of the latest model turn without its tool_result: run those tools (only those);
- the latest step is a tool_result (every tool_use answered) or there is no step: call the model;
- the latest step is a model turn without tool_use: it ended the way its stop_reason in the step
  log says (runrow.get_step: end_turn, pause_turn, ...; pyworker/agent/turn_endings.py); the
  worker died before acting on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

from pyworker.db import steps as steps_api


@dataclass(frozen=True)
class Step:
    seq: int
    kind: str
    payload: Any  # parsed


@dataclass
class History:
    messages: list[dict[str, Any]]
    steps: list[Step]  # this run's own steps, in order
    pending_tool_uses: list[dict[str, Any]] = field(default_factory=list)
    last_model_turn: Step | None = None

    @property
    def last_step(self) -> Step | None:
        return self.steps[-1] if self.steps else None

    def final_text(self) -> str:
        """Text of the run's final assistant message (a paused turn and its continuation are one)."""
        if not self.messages or self.messages[-1]["role"] != "assistant":
            return ""
        content = self.messages[-1]["content"]
        if isinstance(content, str):
            return content
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")


def build_messages(rows: list[steps_api.HistoryRow]) -> list[dict[str, Any]]:
    """The Messages API `messages` array, as conversation_history's COMMENT prescribes."""
    messages: list[dict[str, Any]] = []
    groups: dict[int, list[steps_api.HistoryRow]] = {}
    for row in rows:
        groups.setdefault(row.message_index, []).append(row)
    for index in sorted(groups):
        group = groups[index]
        role = group[0].role
        parsed = [json.loads(r.payload) for r in group]
        if len(group) == 1 and group[0].kind == "user_message" and isinstance(parsed[0], str):
            messages.append({"role": role, "content": parsed[0]})
            continue
        content: list[Any] = []
        for row, value in zip(group, parsed, strict=True):
            if row.kind == "user_message":
                if isinstance(value, str):
                    content.append({"type": "text", "text": value})
                else:
                    content.extend(value)
            elif row.kind == "model_turn":
                content.extend(value)
            else:
                content.append(value)
        messages.append({"role": role, "content": content})
    return _without_blank_answers(messages)


def _blank(content: Any) -> bool:
    """An answer the API refuses to be sent back: no block, or only text blocks of white space."""
    if isinstance(content, str):
        return not content.strip()
    return all(
        isinstance(b, dict) and b.get("type") == "text" and not str(b.get("text", "")).strip()
        for b in content
    )


def _as_blocks(content: Any) -> list[Any]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _without_blank_answers(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history without a past model answer that was empty or white space only. The model may
    end a turn that way, and the API then refuses every request that sends it back ("all messages
    must have non-empty content", "text content blocks must contain non-whitespace text"): every
    later turn of the conversation failed. Such an answer said nothing, so it is left out, and the
    user messages on either side of it become one message (roles must alternate). The final
    message is kept: a paused turn's own content goes back as is."""
    out: list[dict[str, Any]] = []
    last = len(messages) - 1
    for i, message in enumerate(messages):
        if message["role"] == "assistant" and i < last and _blank(message["content"]):
            continue
        if out and out[-1]["role"] == message["role"]:
            out[-1] = {**out[-1], "content": _as_blocks(out[-1]["content"]) + _as_blocks(message["content"])}
            continue
        out.append(message)
    return out


async def load_history(conn: AsyncConnection, conversation_id: UUID, run_id: UUID) -> History:
    rows = await steps_api.conversation_history(conn, conversation_id, run_id)
    own = [
        Step(r.seq, r.kind, json.loads(r.payload))
        for r in rows
        if r.run_id == run_id and r.source == "step" and r.seq is not None
    ]
    history = History(messages=build_messages(rows), steps=own)
    turns = [s for s in own if s.kind == "model_turn"]
    if turns:
        last = turns[-1]
        history.last_model_turn = last
        answered = {s.payload.get("tool_use_id") for s in own if s.kind == "tool_result" and s.seq > last.seq}
        history.pending_tool_uses = [
            b
            for b in last.payload
            if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id") not in answered
        ]
    return history
