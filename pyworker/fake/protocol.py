"""The Messages API wire format for the fake: request validation, thinking signatures, responses.

Signatures. Like the real API, a thinking block's `signature` binds it to the conversation that
produced it: it is an HMAC (server secret) over the model, the system prompt, the tool definitions,
every message before the block's message, the blocks before it in its own message and the thinking
text. What the MAC covers is canonicalized by meaning, not bytes: parsed JSON with sorted keys,
null-valued and `cache_control` fields dropped, string content read as one text block. So a resume
that sends back what the SDK returned verifies however it was serialized, and a change to any text,
tool definition or earlier block does not.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import itertools
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyworker.fake.scenarios import RedactedThinking, Text, Thinking, ToolCall, Turn

SIGNATURE_VERSION = b"\x01"
REDACTED_VERSION = b"\x02"
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")

# Fields the API accepts on each input block (from the SDK's *BlockParam types).
BLOCK_FIELDS: dict[str, frozenset[str]] = {
    "text": frozenset({"type", "text", "cache_control", "citations"}),
    "thinking": frozenset({"type", "thinking", "signature"}),
    "redacted_thinking": frozenset({"type", "data"}),
    "tool_use": frozenset({"type", "id", "name", "input", "cache_control", "caller", "toolset_name"}),
    "tool_result": frozenset({"type", "tool_use_id", "content", "is_error", "cache_control", "toolset_name"}),
}
# What a tool_result's content may hold besides a string (the SDK's ToolResultBlockParam Content);
# the API refuses a list with anything else in it (runrow.complete_tool_call keeps to the same list).
TOOL_RESULT_CONTENT = ("text", "image", "search_result", "document", "tool_reference", "browser_state")
# Accepted without a field check: the fake never produces them.
OPAQUE_BLOCKS = frozenset({"image", "document", "search_result", "server_tool_use", "web_search_tool_result"})


class ApiError(Exception):
    """An error response: HTTP status, error type and message, as the real API words them."""

    def __init__(self, status: int, error_type: str, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = dict(headers or {})


def invalid(message: str) -> ApiError:
    return ApiError(400, "invalid_request_error", message)


def error_body(error_type: str, message: str, request_id: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}, "request_id": request_id}


# ---------------------------------------------------------------------------------------------
# Canonical form (what the signatures cover)


def as_blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content or [])


def canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {
            key: canonical(item)
            for key, item in sorted(value.items())
            if item is not None and key != "cache_control"
        }
    if isinstance(value, list | tuple):
        return [canonical(item) for item in value]
    return value


def canonical_message(message: Mapping[str, Any]) -> dict[str, Any]:
    return {"role": message.get("role"), "content": canonical(as_blocks(message.get("content")))}


def digest(value: Any) -> bytes:
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(data.encode()).digest()


def context_digest(
    body: Mapping[str, Any], before: Sequence[Mapping[str, Any]], prefix: Sequence[Any]
) -> bytes:
    """What a block at this place in the conversation is bound to."""
    return digest(
        {
            "model": body.get("model"),
            "system": canonical(as_blocks(body.get("system"))),
            "tools": canonical(body.get("tools") or []),
            "messages": [canonical_message(m) for m in before],
            "prefix": canonical(list(prefix)),
        }
    )


class Signer:
    def __init__(self, secret: bytes):
        self._secret = secret

    def _mac(self, *parts: bytes) -> bytes:
        mac = hmac.new(self._secret, digestmod=hashlib.sha256)
        for part in parts:
            mac.update(len(part).to_bytes(8, "big"))
            mac.update(part)
        return mac.digest()

    def thinking_signature(self, context: bytes, thinking: str) -> str:
        return base64.b64encode(
            SIGNATURE_VERSION + self._mac(b"thinking", context, thinking.encode())
        ).decode()

    def redacted_data(self, context: bytes) -> str:
        nonce = self._mac(b"nonce", context)[:16]
        return base64.b64encode(REDACTED_VERSION + nonce + self._mac(b"redacted", context, nonce)).decode()

    def check_thinking(self, context: bytes, thinking: str, signature: Any) -> bool:
        if not isinstance(signature, str):
            return False
        return hmac.compare_digest(signature, self.thinking_signature(context, thinking))

    def check_redacted(self, context: bytes, data: Any) -> bool:
        if not isinstance(data, str):
            return False
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError:
            return False
        if len(raw) != 49 or raw[:1] != REDACTED_VERSION:
            return False
        return hmac.compare_digest(raw[17:], self._mac(b"redacted", context, raw[1:17]))

    def tool_use_id(self, context: bytes, index: int) -> str:
        raw = self._mac(b"tool_use_id", context, str(index).encode())
        return "toolu_01" + base64.b32encode(raw).decode().rstrip("=")[:22]


# ---------------------------------------------------------------------------------------------
# Validation


def validate(
    body: Any, signer: Signer, *, merge_consecutive: bool = False, require_max_tokens: bool = True
) -> dict[str, Any]:
    """The request checks the real API makes, in its words. Returns the body with messages
    normalized (merged when `merge_consecutive`)."""
    if not isinstance(body, dict):
        raise invalid("request body must be a JSON object")
    model = body.get("model")
    if model is None:
        raise invalid("model: Field required")
    if not isinstance(model, str) or not model:
        raise invalid("model: Input should be a valid string")
    if "max_tokens" not in body and require_max_tokens:
        raise invalid("max_tokens: Field required")
    max_tokens = body.get("max_tokens", 1 << 30)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise invalid("max_tokens: Input should be a valid integer")
    if max_tokens < 1:
        raise invalid("max_tokens: Input should be greater than or equal to 1")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise invalid("stream: Input should be a valid boolean")
    _validate_system(body.get("system"))
    _validate_tools(body.get("tools"))
    _validate_thinking(body.get("thinking"), max_tokens)
    _validate_tool_choice(body)
    messages = body.get("messages")
    if messages is None:
        raise invalid("messages: Field required")
    if not isinstance(messages, list):
        raise invalid("messages: Input should be a valid list")
    if not messages:
        raise invalid("messages: at least one message is required")
    for i, message in enumerate(messages):
        _validate_message(i, message, last=i == len(messages) - 1)
    if merge_consecutive:
        messages = _merge_consecutive(messages)
    if messages[0]["role"] != "user":
        raise invalid('messages: first message must use the "user" role')
    for previous, current in itertools.pairwise(messages):
        if previous["role"] == current["role"]:
            raise invalid(
                'messages: roles must alternate between "user" and "assistant", '
                f'but found multiple "{current["role"]}" roles in a row'
            )
    _validate_tool_pairing(messages)
    _validate_thinking_history(body, messages)
    _verify_signatures(body, messages, signer)
    return {**body, "messages": messages}


def _validate_system(system: Any) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise invalid("system: Input should be a valid string or list of text blocks")
    for j, block in enumerate(system):
        if (
            not isinstance(block, dict)
            or block.get("type") != "text"
            or not isinstance(block.get("text"), str)
        ):
            raise invalid(f"system.{j}: system blocks must be text blocks")


def _validate_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise invalid("tools: Input should be a valid list")
    seen: set[str] = set()
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise invalid(f"tools.{k}: Input should be an object")
        if tool.get("type") not in (None, "custom"):
            continue  # server tools (web search, ...) carry their own shape
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise invalid(f"tools.{k}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise invalid(f"tools.{k}.custom.input_schema: Field required")
        if schema.get("type") != "object":
            raise invalid(f"tools.{k}.custom.input_schema.type: Input should be 'object'")
        if name in seen:
            raise invalid("tools: Tool names must be unique.")
        seen.add(name)


def _validate_thinking(thinking: Any, max_tokens: int) -> None:
    if thinking is None:
        return
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "disabled", "adaptive"):
        raise invalid(
            "thinking: Input tag found using 'type' does not match 'enabled', 'disabled' or 'adaptive'"
        )
    if thinking["type"] == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or isinstance(budget, bool):
            raise invalid("thinking.enabled.budget_tokens: Field required")
        if budget < 1024:
            raise invalid("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
        if max_tokens <= budget:
            raise invalid("`max_tokens` must be greater than `thinking.budget_tokens`.")


TOOL_CHOICES = ("auto", "any", "tool", "none")
FORCING_TOOL_CHOICES = ("any", "tool")


def _validate_tool_choice(body: Mapping[str, Any]) -> None:
    choice = body.get("tool_choice")
    if choice is None:
        return
    if not isinstance(choice, dict) or choice.get("type") not in TOOL_CHOICES:
        raise invalid(
            "tool_choice: Input tag found using 'type' does not match any of the expected tags: "
            "'auto', 'any', 'tool', 'none'"
        )
    if not body.get("tools"):
        raise invalid("tool_choice may only be specified while providing tools")
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid(
            f"tool_choice.{choice['type']}.disable_parallel_tool_use: Input should be a valid boolean"
        )
    if choice["type"] == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            raise invalid("tool_choice.tool.name: Field required")
        if name not in tool_names(body):
            raise invalid(f"tool_choice.tool.name: Tool '{name}' not found in tools")
    if choice["type"] in FORCING_TOOL_CHOICES and thinking_enabled(body):
        raise invalid("Thinking may not be enabled when tool_choice forces tool use.")


def tool_names(body: Mapping[str, Any]) -> list[str]:
    return [
        t["name"] for t in body.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("name"), str)
    ]


def honour_tool_choice(turn: Turn, body: Mapping[str, Any]) -> Turn:
    """The scenario's turn as the request's tool_choice lets the model answer. `any` / `tool`: the
    API prefills the answer so that it is a tool call (of the named tool), with no text before
    it, whatever the model would have said; one is made up (its required fields blank) when the
    scenario calls none. `none`: no tool call. `disable_parallel_tool_use`: at most one."""
    choice = body.get("tool_choice")
    if not isinstance(choice, Mapping):
        return turn
    blocks = list(turn.blocks)
    stop_reason = turn.stop_reason
    kind = choice.get("type")
    if kind in FORCING_TOOL_CHOICES:
        allowed = [choice["name"]] if kind == "tool" else tool_names(body)
        calls: list[Any] = [b for b in blocks if isinstance(b, ToolCall) and b.name in allowed]
        if not calls and allowed:
            calls = [ToolCall(allowed[0], _blank_input(body, allowed[0]))]
        blocks = calls
        if stop_reason in (None, "end_turn", "stop_sequence"):
            stop_reason = None  # resolved: tool_use
    elif kind == "none":
        blocks = [b for b in blocks if not isinstance(b, ToolCall)] or [Text("")]
        if stop_reason == "tool_use":
            stop_reason = None  # resolved: end_turn
    if choice.get("disable_parallel_tool_use") and kind != "none":
        first = next((i for i, b in enumerate(blocks) if isinstance(b, ToolCall)), None)
        blocks = [b for i, b in enumerate(blocks) if not isinstance(b, ToolCall) or i == first]
    return dataclasses.replace(turn, blocks=tuple(blocks), stop_reason=stop_reason)


_BLANKS: dict[str, Any] = {
    "string": "",
    "integer": 0,
    "number": 0,
    "boolean": False,
    "array": [],
    "object": {},
}


def _blank_input(body: Mapping[str, Any], name: str) -> dict[str, Any]:
    tool = next(t for t in body.get("tools") or [] if isinstance(t, dict) and t.get("name") == name)
    schema = tool.get("input_schema") or {}
    properties = schema.get("properties") or {}
    return {
        field: _BLANKS.get(str((properties.get(field) or {}).get("type")), "")
        for field in schema.get("required") or []
    }


def thinking_enabled(body: Mapping[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive")


def _validate_message(i: int, message: Any, *, last: bool) -> None:
    if not isinstance(message, dict):
        raise invalid(f"messages.{i}: Input should be an object")
    role = message.get("role")
    if role == "system":
        raise invalid(f"messages.{i}.role: use the top-level `system` parameter for system prompts")
    if role not in ("user", "assistant"):
        raise invalid(f"messages.{i}.role: Input should be 'user' or 'assistant'")
    if "content" not in message:
        raise invalid(f"messages.{i}.content: Field required")
    content = message["content"]
    if isinstance(content, str):
        if not content and not (last and role == "assistant"):
            raise invalid(
                f"messages.{i}: all messages must have non-empty content except for the optional final "
                "assistant message"
            )
        if content and not content.strip():
            raise invalid(WHITESPACE_ONLY)
        return
    if not isinstance(content, list):
        raise invalid(f"messages.{i}.content: Input should be a valid string or list")
    if not content and not (last and role == "assistant"):
        raise invalid(
            f"messages.{i}: all messages must have non-empty content except for the optional final "
            "assistant message"
        )
    for j, block in enumerate(content):
        _validate_block(i, j, role, block)
    # As the API: a message whose blocks are all text, and all white space, is refused (white
    # space beside other text is taken).
    texts = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") == "text"]
    if texts and len(texts) == len(content) and not any(t.strip() for t in texts if isinstance(t, str)):
        raise invalid(WHITESPACE_ONLY)


WHITESPACE_ONLY = "messages: text content blocks must contain non-whitespace text"


def _validate_block(i: int, j: int, role: str, block: Any) -> None:
    where = f"messages.{i}.content.{j}"
    if not isinstance(block, dict):
        raise invalid(f"{where}: Input should be an object")
    kind = block.get("type")
    if kind in OPAQUE_BLOCKS:
        return
    if kind not in BLOCK_FIELDS:
        raise invalid(
            f"{where}: Input tag '{kind}' found using 'type' does not match any of the expected tags"
        )
    for key in block:
        if key not in BLOCK_FIELDS[kind]:
            raise invalid(f"{where}.{kind}.{key}: Extra inputs are not permitted")
    if kind in ("thinking", "redacted_thinking", "tool_use") and role != "assistant":
        raise invalid(f"{where}: `{kind}` blocks are only allowed in `assistant` messages")
    if kind == "tool_result" and role != "user":
        raise invalid(f"{where}: `tool_result` blocks are only allowed in `user` messages")
    if kind == "text":
        if not isinstance(block.get("text"), str):
            raise invalid(f"{where}.text.text: Field required")
        if not block["text"]:
            raise invalid("messages: text content blocks must be non-empty")
    elif kind == "thinking":
        for key in ("thinking", "signature"):
            if not isinstance(block.get(key), str):
                raise invalid(f"{where}.thinking.{key}: Field required")
    elif kind == "redacted_thinking":
        if not isinstance(block.get("data"), str):
            raise invalid(f"{where}.redacted_thinking.data: Field required")
    elif kind == "tool_use":
        if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
            raise invalid(f"{where}.tool_use: `id` and `name` are required")
        if not isinstance(block.get("input"), dict):
            raise invalid(f"{where}.tool_use.input: Input should be a valid dictionary")
    elif kind == "tool_result":
        if not isinstance(block.get("tool_use_id"), str):
            raise invalid(f"{where}.tool_result.tool_use_id: Field required")
        _validate_tool_result_content(f"{where}.tool_result.content", block.get("content"))


def _validate_tool_result_content(where: str, content: Any) -> None:
    """As the API: a string, or a list of content blocks (TOOL_RESULT_CONTENT); a tool's own list
    of rows or values sent as the content is refused."""
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise invalid(f"{where}: Input should be a valid string or list")
    expected = ", ".join(f"'{t}'" for t in TOOL_RESULT_CONTENT)
    for k, item in enumerate(content):
        if not isinstance(item, dict):
            raise invalid(f"{where}.{k}: Input should be a valid dictionary or object to extract fields from")
        kind = item.get("type")
        if kind not in TOOL_RESULT_CONTENT:
            raise invalid(
                f"{where}.{k}: Input tag '{kind}' found using 'type' does not match any of the "
                f"expected tags: {expected}"
            )
        if kind == "text" and not isinstance(item.get("text"), str):
            raise invalid(f"{where}.{k}.text.text: Field required")


def _merge_consecutive(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    for message in messages:
        if merged and merged[-1]["role"] == message["role"]:
            merged[-1] = {
                "role": message["role"],
                "content": as_blocks(merged[-1]["content"]) + as_blocks(message["content"]),
            }
        else:
            merged.append(message)
    return merged


def _tool_use_ids(message: Mapping[str, Any]) -> list[str]:
    return [b["id"] for b in as_blocks(message.get("content")) if b.get("type") == "tool_use"]


def _validate_tool_pairing(messages: list[dict[str, Any]]) -> None:
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            ids = _tool_use_ids(message)
            if not ids or i + 1 == len(messages):
                continue
            answered = {
                b.get("tool_use_id")
                for b in as_blocks(messages[i + 1]["content"])
                if b.get("type") == "tool_result"
            }
            missing = [t for t in ids if t not in answered]
            if missing:
                raise invalid(
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
                    f"after: {', '.join(missing)}. Each `tool_use` block must have a corresponding "
                    "`tool_result` block in the next message."
                )
            continue
        blocks = as_blocks(message["content"])
        offered = set(_tool_use_ids(messages[i - 1])) if i > 0 else set()
        seen_other = False
        for j, block in enumerate(blocks):
            if block.get("type") != "tool_result":
                seen_other = True
                continue
            if block["tool_use_id"] not in offered:
                raise invalid(
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{block['tool_use_id']}. Each `tool_result` block must have a corresponding `tool_use` "
                    "block in the previous message."
                )
            if seen_other:
                raise invalid(
                    f"messages.{i}.content.{j}: `tool_result` blocks must come first in the content of a "
                    "`user` message, before any other block."
                )


def _validate_thinking_history(body: Mapping[str, Any], messages: list[dict[str, Any]]) -> None:
    """With thinking on, the assistant message that called the tools being answered must start with
    its thinking block: a loop that drops thinking blocks on the way back is refused."""
    if not thinking_enabled(body) or len(messages) < 2 or messages[-1]["role"] != "user":
        return
    if not any(b.get("type") == "tool_result" for b in as_blocks(messages[-1]["content"])):
        return
    i = len(messages) - 2
    first = as_blocks(messages[i]["content"])[0]
    if first.get("type") not in ("thinking", "redacted_thinking"):
        raise invalid(
            f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
            f"`{first.get('type')}`. When `thinking` is enabled, a final `assistant` message must start with "
            "a thinking block (preceding the lastmost set of `tool_use` and `tool_result` blocks). "
            "We recommend you include thinking blocks from previous turns."
        )


def _verify_signatures(body: Mapping[str, Any], messages: list[dict[str, Any]], signer: Signer) -> None:
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        blocks = as_blocks(message["content"])
        for j, block in enumerate(blocks):
            kind = block.get("type")
            if kind not in ("thinking", "redacted_thinking"):
                continue
            context = context_digest(body, messages[:i], blocks[:j])
            if kind == "thinking" and not signer.check_thinking(
                context, block["thinking"], block["signature"]
            ):
                raise invalid(f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block")
            if kind == "redacted_thinking" and not signer.check_redacted(context, block["data"]):
                raise invalid(f"messages.{i}.content.{j}: Invalid `data` in `redacted_thinking` block")


# ---------------------------------------------------------------------------------------------
# Responses


def estimate_tokens(value: Any) -> int:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return max(1, len(text) // 4)


def render_content(turn: Turn, body: Mapping[str, Any], signer: Signer) -> list[dict[str, Any]]:
    """The content blocks of the response, signed against the request's history. A request that
    ends with an assistant message (prefill, or a paused turn sent back) is continued: the new blocks
    extend that message, so they are signed as its continuation."""
    messages = list(body["messages"])
    if messages and messages[-1]["role"] == "assistant":
        before, prefix = messages[:-1], as_blocks(messages[-1]["content"])
    else:
        before, prefix = messages, []
    with_thinking = thinking_enabled(body)
    content: list[dict[str, Any]] = []
    tool_index = 0
    for block in turn.blocks:
        context = context_digest(body, before, prefix + content)
        if isinstance(block, Text):
            content.append({"type": "text", "text": block.text})
        elif isinstance(block, Thinking):
            if with_thinking:
                signature = signer.thinking_signature(context, block.thinking)
                content.append({"type": "thinking", "thinking": block.thinking, "signature": signature})
        elif isinstance(block, RedactedThinking):
            if with_thinking:
                content.append({"type": "redacted_thinking", "data": signer.redacted_data(context)})
        elif isinstance(block, ToolCall):
            tool_id = signer.tool_use_id(context, tool_index)
            tool_index += 1
            content.append(
                {"type": "tool_use", "id": tool_id, "name": block.name, "input": dict(block.input)}
            )
    return content


def block_tokens(block: Mapping[str, Any]) -> int:
    kind = block["type"]
    if kind == "text":
        return estimate_tokens(block["text"])
    if kind == "thinking":
        return estimate_tokens(block["thinking"])
    if kind == "tool_use":
        return estimate_tokens(block["input"]) + estimate_tokens(block["name"])
    return 1


def limit_output(
    content: list[dict[str, Any]], max_tokens: int, room: int
) -> tuple[list[dict[str, Any]], str | None]:
    """Cut the output where the real API stops: at `max_tokens`, or where the context window is full
    (`room` tokens left after the input). Returns the kept blocks and the stop reason of a cut."""
    limit = min(max_tokens, room)
    reason = "max_tokens" if max_tokens <= room else "model_context_window_exceeded"
    kept: list[dict[str, Any]] = []
    used = 0
    for block in content:
        cost = block_tokens(block)
        if used + cost <= limit:
            kept.append(block)
            used += cost
            continue
        if block["type"] == "text" and limit > used:
            kept.append({**block, "text": block["text"][: (limit - used) * 4]})
        return kept, reason
    return kept, None


def stop_at_sequence(
    content: list[dict[str, Any]], sequences: Any
) -> tuple[list[dict[str, Any]], str | None]:
    """Cut the output where the real API stops at one of the request's `stop_sequences`: at its
    first occurrence in a text block, the sequence itself left out, and nothing after it.
    Returns the kept blocks and the sequence that matched (None: none did)."""
    wanted = [s for s in sequences or () if isinstance(s, str) and s]
    for i, block in enumerate(content):
        if block["type"] != "text":
            continue
        found = [(block["text"].find(s), s) for s in wanted if s in block["text"]]
        if found:
            at, sequence = min(found)
            return [*content[:i], {**block, "text": block["text"][:at]}], sequence
    return content, None


def message_json(
    message_id: str,
    model: str,
    content: list[dict[str, Any]],
    turn: Turn,
    usage: Mapping[str, int],
    stop_reason: str | None = None,
    stop_sequence: str | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason or turn.resolved_stop_reason,
        "stop_sequence": stop_sequence,
        "usage": dict(usage),
    }
    if turn.stop_details is not None and stop_reason is None:
        message["stop_details"] = dict(turn.stop_details)
    return message


def usage_json(
    input_fields: Mapping[str, Any], out_tokens: int, server_tool_use: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """`input_fields`: input_tokens and the cache fields, from the prompt cache (fake/cache.py).
    `server_tool_use`: the turn's server-tool requests (`Turn.server_tool_use`), as the API's
    `usage.server_tool_use` (absent when the turn ran none)."""
    usage = {**input_fields, "output_tokens": out_tokens, "service_tier": "standard"}
    if server_tool_use is not None:
        usage["server_tool_use"] = dict(server_tool_use)
    return usage


def _chunks(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start : start + size]


def stream_events(
    message: Mapping[str, Any], chunk: int = 12, tool_json: str | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The SSE events of a streamed message, in the real API's order. `tool_json`: what every
    tool_use block streams as its input JSON instead of its input (a fault: see faults.py)."""
    usage = dict(message["usage"])
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start.pop("stop_details", None)
    start["usage"] = {**usage, "output_tokens": 1}
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
        elif kind == "thinking":
            opening = {"type": "thinking", "thinking": "", "signature": ""}
        elif kind == "tool_use":
            opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        else:
            opening = dict(block)
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": opening}
        if index == 0:
            yield "ping", {"type": "ping"}
        for delta in _deltas(block, chunk, tool_json):
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    delta: dict[str, Any] = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    if "stop_details" in message:
        delta["stop_details"] = message["stop_details"]
    final_usage = {k: v for k, v in usage.items() if k != "service_tier"}
    yield "message_delta", {"type": "message_delta", "delta": delta, "usage": final_usage}
    yield "message_stop", {"type": "message_stop"}


def _deltas(block: Mapping[str, Any], chunk: int, tool_json: str | None = None) -> Iterator[dict[str, Any]]:
    kind = block["type"]
    if kind == "text":
        for piece in _chunks(block["text"], chunk):
            yield {"type": "text_delta", "text": piece}
    elif kind == "thinking":
        for piece in _chunks(block["thinking"], chunk):
            yield {"type": "thinking_delta", "thinking": piece}
        yield {"type": "signature_delta", "signature": block["signature"]}
    elif kind == "tool_use":
        yield {"type": "input_json_delta", "partial_json": ""}
        text = json.dumps(block["input"], ensure_ascii=False) if tool_json is None else tool_json
        for piece in _chunks(text, chunk):
            yield {"type": "input_json_delta", "partial_json": piece}


def sse(event: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()
