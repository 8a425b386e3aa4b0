"""Prompt caching in the fake Messages API: prefix hashes with a TTL, usage split as the API splits it.

The prompt is read in the API's order (tools, then system, then messages) as a list of blocks;
a block carrying `cache_control` is a breakpoint, and the blocks up to it are its prefix. Per
request:

- at most 4 breakpoints; `ttl` is "5m" (the default) or "1h", and a 1-hour breakpoint may not
  follow a 5-minute one (400s worded like the API's);
- a breakpoint whose prefix is shorter than the model's minimum cacheable length is ignored;
- the longest prefix at a breakpoint that is cached (same model, every byte before it the same,
  not expired) is read: `cache_read_input_tokens`, and its entry's TTL starts again;
- from there to the last breakpoint is written: `cache_creation_input_tokens` (split by the TTL
  of the breakpoint closing each stretch in `cache_creation`), one entry per breakpoint;
- `input_tokens` is the rest: the blocks after the last breakpoint, or all of them on a miss.

Approximations (deterministic, documented): a block counts bytes/4 tokens of its canonical JSON
(sorted keys, nulls and `cache_control` dropped, with its role), at least 1; the API's 20-block
lookback before a breakpoint is not modelled, so a hit needs a breakpoint exactly where the earlier
request put one (stricter than the API: a loop that passes here also hits there). Thinking blocks
of earlier turns count like any block.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyworker.fake import protocol as wire

MAX_BREAKPOINTS = 4
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
# Minimum cacheable prompt length, tokens (Anthropic's prompt-caching docs): 1024 for the Sonnet
# and Opus class, 2048 for the Haiku 3 class, 4096 for Opus 4.5/4.6 and Haiku 4.5.
MIN_CACHEABLE = (
    ("claude-opus-4-5", 4096),
    ("claude-opus-4-6", 4096),
    ("claude-haiku-4-5", 4096),
    ("haiku", 2048),
)
DEFAULT_MIN_CACHEABLE = 1024


def min_cacheable(model: str) -> int:
    for fragment, tokens in MIN_CACHEABLE:
        if fragment in model:
            return tokens
    return DEFAULT_MIN_CACHEABLE


@dataclass(frozen=True)
class Unit:
    """One block of the prompt in API order: its tokens and, when it is a breakpoint, its TTL."""

    data: bytes
    tokens: int
    ttl: str | None


@dataclass(frozen=True)
class CacheUsage:
    input_tokens: int  # not cached: billed at the full input price
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    ephemeral_5m_input_tokens: int
    ephemeral_1h_input_tokens: int

    def usage_fields(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.ephemeral_5m_input_tokens,
                "ephemeral_1h_input_tokens": self.ephemeral_1h_input_tokens,
            },
        }


def _marker_ttl(where: str, marker: Any) -> str:
    if not isinstance(marker, Mapping) or marker.get("type") != "ephemeral":
        raise wire.invalid(f"{where}.cache_control.type: Input should be 'ephemeral'")
    ttl = marker.get("ttl", "5m")
    if ttl not in TTL_SECONDS:
        raise wire.invalid(f"{where}.cache_control.ttl: Input should be '5m' or '1h'")
    return str(ttl)


def _unit(where: str, value: Mapping[str, Any], role: str | None = None) -> Unit:
    body = wire.canonical(value)
    if role is not None:
        body = {"role": role, "block": body}
    data = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    marker = value.get("cache_control")
    ttl = None if marker is None else _marker_ttl(where, marker)
    return Unit(data, max(1, len(data) // 4), ttl)


def prompt_units(body: Mapping[str, Any]) -> list[Unit]:
    """The prompt's blocks in the order the API caches them: tools, system, messages. Checks the
    breakpoints (count, ttl, order) the way the API does."""
    units = [_unit(f"tools.{k}", tool) for k, tool in enumerate(body.get("tools") or [])]
    units += [_unit(f"system.{j}", block) for j, block in enumerate(wire.as_blocks(body.get("system")))]
    for i, message in enumerate(body.get("messages") or []):
        for j, block in enumerate(wire.as_blocks(message.get("content"))):
            units.append(_unit(f"messages.{i}.content.{j}", block, str(message.get("role"))))
    ttls = [u.ttl for u in units if u.ttl is not None]
    if len(ttls) > MAX_BREAKPOINTS:
        raise wire.invalid(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(ttls)}."
        )
    if any(a == "5m" and b == "1h" for a, b in itertools.pairwise(ttls)):
        raise wire.invalid(
            "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block"
        )
    return units


def prompt_tokens(body: Mapping[str, Any]) -> int:
    return sum(u.tokens for u in prompt_units(body))


class PromptCache:
    """Prefix hash -> expiry, on an injectable clock (seconds; `time.monotonic` by default)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._entries: dict[bytes, float] = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        now = self.clock()
        with self._lock:
            return sum(1 for expiry in self._entries.values() if expiry > now)

    def account(self, body: Mapping[str, Any]) -> CacheUsage:
        """Serve one request's prompt: read the longest cached prefix, write the rest up to the
        last breakpoint, and say how its input tokens split."""
        units = prompt_units(body)
        minimum = min_cacheable(str(body.get("model")))
        chain = hashlib.sha256(str(body.get("model")).encode())
        breakpoints: list[tuple[bytes, int, str]] = []  # (prefix hash, prefix tokens, ttl)
        total = 0
        for unit in units:
            chain.update(len(unit.data).to_bytes(8, "big") + unit.data)
            total += unit.tokens
            if unit.ttl is not None and total >= minimum:
                breakpoints.append((chain.copy().digest(), total, unit.ttl))
        now = self.clock()
        with self._lock:
            hit = -1
            for k in range(len(breakpoints) - 1, -1, -1):
                expiry = self._entries.get(breakpoints[k][0])
                if expiry is not None and expiry > now:
                    hit = k
                    break
            read = breakpoints[hit][1] if hit >= 0 else 0
            if hit >= 0:  # a hit starts the entry's lifetime again, at no cost
                key, _, ttl = breakpoints[hit]
                self._entries[key] = max(self._entries[key], now + TTL_SECONDS[ttl])
            written = {"5m": 0, "1h": 0}
            covered = read
            for key, tokens, ttl in breakpoints[hit + 1 :]:
                written[ttl] += tokens - covered
                covered = tokens
                self._entries[key] = now + TTL_SECONDS[ttl]
            self._entries = {k: e for k, e in self._entries.items() if e > now}
        return CacheUsage(
            input_tokens=total - covered,
            cache_read_input_tokens=read,
            cache_creation_input_tokens=written["5m"] + written["1h"],
            ephemeral_5m_input_tokens=written["5m"],
            ephemeral_1h_input_tokens=written["1h"],
        )
