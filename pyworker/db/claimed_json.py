"""The JSON of a claimed run (its metadata and tool definitions), read so that one run nobody can
read does not stop every claim.

jsonb keeps a number such as 1e5000 exactly and prints all its 5,001 digits, which Python's
`json` refuses (4,300 at most), and it nests deeper than Python's recursion allows. Since issue
11's SQL audit `enqueue_run` refuses both, but a run enqueued before that may still be queued.
Read with psycopg's default loader, such a run made the whole claim raise after the database had
granted it: the claim rolled back, the run stayed at the head of the queue, and every worker's
every claim failed the same way. Read through `loads`, its field is an `UnreadableJSON`, an empty
dict that says why, and the supervisor ends the run failed once (a deterministic failure) while
the claim and the runs beside it go on.
"""

from __future__ import annotations

import json
from json.decoder import scanstring
from typing import Any

from psycopg.abc import AdaptContext
from psycopg.types.json import set_json_loads


class UnreadableJSON(dict[str, Any]):
    """A JSON value this process cannot read, as an empty dict (so `.get` still works where a
    run's metadata is read before its handler), with the reason in `error`."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


def loads(data: str | bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        return UnreadableJSON(f"{type(exc).__name__}: {str(exc)[:200]}")


def read_claims_with(context: AdaptContext) -> None:
    """Read json and jsonb through `loads` in `context` (the claim's cursor)."""
    set_json_loads(loads, context)


def unreadable_field(run: Any) -> tuple[str, UnreadableJSON] | None:
    """The first of a claimed run's JSON fields that could not be read, with its value."""
    for name in ("metadata", "tools"):
        value = getattr(run, name, None)
        if isinstance(value, UnreadableJSON):
            return name, value
    return None


_NOT_FOUND = object()
_DECODER = json.JSONDecoder()


def top_level_member(text: str, name: str, default: Any = None) -> Any:
    """The value of member `name` of the JSON object `text` (`default` when it has none),
    decoding that member alone: the others are stepped over, not decoded, so one nested deeper
    than Python decodes, or a number it cannot hold, does not hide it (a webhook payload written
    before migration 0069: its user_id says which key signs it). ValueError when `text` is not a
    JSON object or the member itself cannot be decoded."""
    try:
        found = _member(text, name)
    except (IndexError, RecursionError, ValueError) as exc:
        raise ValueError(f"cannot read member {name!r}: {type(exc).__name__}") from None
    return default if found is _NOT_FOUND else found


def _member(text: str, name: str) -> Any:
    i = _space(text, 0)
    if text[i] != "{":
        raise ValueError("not an object")
    i = _space(text, i + 1)
    if text[i] == "}":
        return _NOT_FOUND
    while True:
        if text[i] != '"':
            raise ValueError("a member name must be a string")
        key, i = scanstring(text, i + 1)
        i = _space(text, i)
        if text[i] != ":":
            raise ValueError("':' expected")
        i = _space(text, i + 1)
        if key == name:
            return _DECODER.raw_decode(text, i)[0]
        # Step over the value: strings whole (they may hold brackets), brackets counted.
        depth = 0
        while depth or text[i] not in ",}":
            c = text[i]
            if c == '"':
                i = scanstring(text, i + 1)[1]
                continue
            if c in "[{":
                depth += 1
            elif c in "]}":
                depth -= 1
            i += 1
        if text[i] == "}":
            return _NOT_FOUND
        i = _space(text, i + 1)


def _space(text: str, i: int) -> int:
    """The index of the first character at or after `i` that is not JSON white space."""
    while i < len(text) and text[i] in " \t\n\r":
        i += 1
    return i
