"""Where a request carries `cache_control` breakpoints, so each model call re-reads what the last
one paid to process instead of paying for it again.

A run's prompt is a prefix that only grows: the pinned system prompt and tools, then the history,
byte-identical on every request by construction (pyworker/agent/history.py). So, per request:

1. the end of the pinned prefix (the last system block, or the last tool without a system
   prompt): shared by every run with the same prompt and model, and by every request of a run;
2. the end of the history the previous request ended with (the last user message before the
   final message): what that request wrote, read back now;
3. the end of the final message: written now, read by the next request (or by another worker
   resuming the run, which sends the same bytes).

At most 4 breakpoints per request (the API's limit), counting markers the user's own content
already carries; thinking blocks cannot carry one, so a marker goes on the last block that can.
`metadata.prompt_cache` picks the TTL: "5m" (default; a write costs 1.25x the input price, a read
0.1x), "1h" (a write costs 2x; pays when a run pauses longer than 5 minutes, e.g. waiting for an
approval) or "off". The markers are request decoration only: blocks are copied before one is
added, so the step log and the History the loop keeps never see them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MODES = ("off", "5m", "1h")
DEFAULT_MODE = "5m"
MAX_BREAKPOINTS = 4
UNMARKABLE = frozenset({"thinking", "redacted_thinking"})


def cache_mode(metadata: Mapping[str, Any] | None) -> str:
    """The run's prompt_cache setting. enqueue_run refuses any other value, so an unknown one
    here is a run enqueued before that check: it gets the default."""
    mode = (metadata or {}).get("prompt_cache", DEFAULT_MODE)
    return mode if mode in MODES else DEFAULT_MODE


def add_breakpoints(params: dict[str, Any], mode: str) -> dict[str, Any]:
    """`params` with cache breakpoints; `params` and what it holds are left unchanged."""
    params = _within_limit(params)
    if mode == "off":
        return _ttls_in_order(params)
    marker: dict[str, Any] = {"type": "ephemeral"}
    if mode == "1h":
        marker["ttl"] = "1h"
    out = dict(params)
    room = MAX_BREAKPOINTS - _markers(params)
    messages: list[Any] = list(params.get("messages") or [])
    last = len(messages) - 1
    previous = next((i for i in range(last - 1, -1, -1) if messages[i].get("role") == "user"), None)
    # In order of what a breakpoint saves: the final message's lets the next request read
    # everything; the pinned one is shared across runs; the previous one is what this one reads.
    targets: list[str | int] = [last, "pinned"] + ([previous] if previous is not None else [])
    for target in targets:
        if room <= 0:
            break
        if target == "pinned":
            placed = _mark_pinned(out, marker)
        else:
            assert isinstance(target, int)
            placed = _mark_message(messages, target, marker)
        room -= placed
    out["messages"] = messages
    return _ttls_in_order(out)


def _ttls_in_order(params: dict[str, Any]) -> dict[str, Any]:
    """`params` with no 1-hour marker after a 5-minute one, in the order the API reads a prompt
    (tools, system, messages): it refuses the request otherwise ("a ttl='1h' cache_control block
    must not come after a ttl='5m' cache_control block"). A user's 1-hour marker in a later turn
    after our 5-minute one on the system prompt (the default), or our 1-hour ones after a user's
    5-minute marker in the history, failed the turn, and every later turn of the conversation
    with it. Such a 1-hour marker becomes a 5-minute one: a shorter cache, never a dearer write."""
    seen_5m = False

    def fix(blocks: list[Any]) -> list[Any] | None:
        nonlocal seen_5m
        changed = None
        for j, block in enumerate(blocks):
            marker = block.get("cache_control") if isinstance(block, Mapping) else None
            if not isinstance(marker, Mapping):
                continue
            if marker.get("ttl", "5m") != "1h":
                seen_5m = True
            elif seen_5m:
                changed = changed or list(blocks)
                changed[j] = {**block, "cache_control": {k: v for k, v in marker.items() if k != "ttl"}}
        return changed

    out = dict(params)
    changed = False
    for key in ("tools", "system"):
        if isinstance(out.get(key), list) and (fixed := fix(out[key])) is not None:
            out[key], changed = fixed, True
    messages = list(out.get("messages") or [])
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and (fixed := fix(content)) is not None:
            messages[i], changed = {**message, "content": fixed}, True
    if not changed:
        return params
    out["messages"] = messages
    return out


def _within_limit(params: dict[str, Any]) -> dict[str, Any]:
    """`params` with at most MAX_BREAKPOINTS markers: the users' own, from all the turns a history
    holds, add up (enqueue_run takes 4 a turn), and the API refuses every request past 4, so a
    conversation whose turns carried 3 each failed from its second turn on. The earliest markers
    go first: a marker only says where a cache prefix ends, and the latest ones end the longest."""
    excess = _markers(params) - MAX_BREAKPOINTS
    if excess <= 0:
        return params
    messages = list(params.get("messages") or [])
    for i, message in enumerate(messages):
        content = message.get("content")
        if excess <= 0 or not isinstance(content, list):
            continue
        blocks = list(content)
        for j, block in enumerate(blocks):
            if excess > 0 and isinstance(block, Mapping) and block.get("cache_control") is not None:
                blocks[j] = {k: v for k, v in block.items() if k != "cache_control"}
                excess -= 1
        messages[i] = {**message, "content": blocks}
    return {**params, "messages": messages}


def _markers(value: Any) -> int:
    if isinstance(value, Mapping):
        own = 1 if value.get("cache_control") is not None else 0
        return own + sum(_markers(v) for k, v in value.items() if k != "cache_control")
    if isinstance(value, list | tuple):
        return sum(_markers(v) for v in value)
    return 0


def _mark_pinned(params: dict[str, Any], marker: dict[str, Any]) -> int:
    system = params.get("system")
    if isinstance(system, str) and system:
        params["system"] = [{"type": "text", "text": system, "cache_control": marker}]
        return 1
    if isinstance(system, list) and system and isinstance(system[-1], Mapping):
        if system[-1].get("cache_control") is not None:
            return 0
        params["system"] = [*system[:-1], {**system[-1], "cache_control": marker}]
        return 1
    tools = params.get("tools")
    if isinstance(tools, list) and tools and isinstance(tools[-1], Mapping):
        if tools[-1].get("cache_control") is not None:
            return 0
        params["tools"] = [*tools[:-1], {**tools[-1], "cache_control": marker}]
        return 1
    return 0


def _mark_message(messages: list[Any], index: int, marker: dict[str, Any]) -> int:
    message = messages[index]
    content = message.get("content")
    if isinstance(content, str):
        if not content:
            return 0
        blocks: list[Any] = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        blocks = list(content)
    else:
        return 0
    for j in range(len(blocks) - 1, -1, -1):
        block = blocks[j]
        if not isinstance(block, Mapping) or block.get("type") in UNMARKABLE:
            continue
        if block.get("cache_control") is not None:
            return 0  # the user's own breakpoint already ends this prefix
        blocks[j] = {**block, "cache_control": marker}
        messages[index] = {**message, "content": blocks}
        return 1
    return 0
