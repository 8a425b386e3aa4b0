"""A request's input as far as the API's input-tokens-per-minute limit can count it, estimated
from its text alone: what `never_fits` compares with the limit a 429 states, so a 429 fails a run
only for a request that no wait lets through.

The plain estimate (JSON characters / 4, limits.estimate_input_tokens) is the right size for a
bucket's reservation but too large for that judgement in two ways (the review of 436ee21):

- base64 payloads (an image's or a document's `source.data`): the API counts an image by its
  pixels (about 1,600 tokens at most) and a PDF by its pages, not by its encoded bytes; a 200 KB
  image estimated at 66,721 tokens failed a run at a 30,000 limit. Left out here: what the
  payload costs is then under-counted, so such a 429 is waited out (bounded by the 429 cap).
- a prefix the prompt cache may serve: cache reads do not count toward the limit. Everything up
  to the last `cache_control` breakpoint before the request's final block (the pinned system
  prompt and tools on a first turn; the history a previous request wrote) may be a read. The
  breakpoint on the final block itself ends what this request writes, which counts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

CHARS_PER_TOKEN = 4
PAYLOADS = frozenset({"image", "document"})


def uncached_input_tokens(params: Mapping[str, Any]) -> int:
    """About how many of the request's input tokens count toward the per-minute limit even if
    every marked prefix is read from the cache, leaving base64 payloads out."""
    blocks = _blocks(params)
    cached = max((i for i, block in enumerate(blocks[:-1]) if _marked(block)), default=-1)
    size = sum(_size(block) for block in blocks[cached + 1 :])
    return size // CHARS_PER_TOKEN + 1


def _blocks(params: Mapping[str, Any]) -> list[Any]:
    """The request's blocks in the order the API reads a prompt: tools, system, messages."""
    out: list[Any] = list(params.get("tools") or [])
    system = params.get("system")
    out.extend(system if isinstance(system, list) else [system] if system else [])
    for message in params.get("messages") or []:
        content = message.get("content") if isinstance(message, Mapping) else message
        out.extend(content if isinstance(content, list) else [content])
    return out


def _marked(value: Any) -> bool:
    """A breakpoint on the block or inside it (a tool_result's content)."""
    if isinstance(value, Mapping):
        return value.get("cache_control") is not None or any(_marked(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_marked(v) for v in value)
    return False


def _size(block: Any) -> int:
    return len(json.dumps(_without_payloads(block), ensure_ascii=False, default=str))


def _without_payloads(value: Any) -> Any:
    """`value` without base64 payloads, also inside a tool_result's content."""
    if isinstance(value, Mapping):
        if value.get("type") in PAYLOADS and _base64(value.get("source")):
            value = {**value, "source": {k: v for k, v in value["source"].items() if k != "data"}}
        return {k: _without_payloads(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_payloads(v) for v in value]
    return value


def _base64(source: Any) -> bool:
    return isinstance(source, Mapping) and source.get("type") == "base64"
