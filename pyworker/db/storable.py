"""What PostgreSQL's text and jsonb cannot store, found in a value Python's json module read.

json.loads takes what PostgreSQL refuses: the escape \\u0000 (text and jsonb hold no NUL), a
lone surrogate such as \\ud800 (not text at all), and 1e999 or NaN (read as float infinity and
NaN, which JSON cannot spell back). Sent on, each fails inside the database with an error that
names neither the field nor the place. The one walk of a value lives here; each surface (the
HTTP service, the CLI) phrases what it finds for its own readers.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any


class Fault(enum.Enum):
    NUL = "nul"  # text holding U+0000
    SURROGATE = "surrogate"  # text holding a lone surrogate, \ud800-\udfff
    NOT_FINITE = "not_finite"  # a number read as infinity or NaN
    TOO_DEEP = "too_deep"  # arrays and objects nested past the caller's limit


@dataclass(frozen=True)
class Unstorable:
    fault: Fault
    path: str  # where, from the root's name: metadata.a[2]
    in_key: bool = False  # the text is an object's key, not a value


def text_fault(value: str) -> Fault | None:
    if "\x00" in value:
        return Fault.NUL
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return Fault.SURROGATE
    return None


def find_unstorable(value: Any, root: str, max_depth: int | None = None) -> Unstorable | None:
    """The first thing in value, depth first, that jsonb cannot store, or None. max_depth: how
    many levels of arrays and objects are allowed (None: no limit here)."""
    return _walk(value, root, 0, max_depth)


def _walk(value: Any, path: str, depth: int, max_depth: int | None) -> Unstorable | None:
    if isinstance(value, str):
        fault = text_fault(value)
        return None if fault is None else Unstorable(fault, path)
    if isinstance(value, float) and not math.isfinite(value):
        return Unstorable(Fault.NOT_FINITE, path)
    if not isinstance(value, dict | list):
        return None
    if max_depth is not None and depth >= max_depth:
        return Unstorable(Fault.TOO_DEEP, path)
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _walk(item, f"{path}[{i}]", depth + 1, max_depth)
            if found is not None:
                return found
        return None
    for key, item in value.items():
        fault = text_fault(key)
        if fault is not None:
            return Unstorable(fault, path, in_key=True)
        found = _walk(item, f"{path}.{short(key)}", depth + 1, max_depth)
        if found is not None:
            return found
    return None


def short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
