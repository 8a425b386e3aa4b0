"""U+0000 in what the worker writes to `jsonb` (journal events, a run's result).

PostgreSQL's jsonb cannot hold U+0000 (22P05), and a model can produce it in its text. So an
object whose strings hold a NUL is written with one extra key, `"_encoding": "nul-percent"`,
and in every string inside it (keys and values, at any depth) `%` is written `%25` and U+0000
`%00`. Anything else is written as is, so the common case costs nothing and reads as before.

To read it back, in any language: for an object with `"_encoding": "nul-percent"` (at any depth;
a `complete` event carries the run's result as such an object), drop that key and, in every
string inside it, replace `%00` with U+0000 and `%25` with `%` in one left-to-right pass
(JavaScript: `s.replace(/%(00|25)/g, (m) => (m === "%00" ? "\\0" : "%"))`). The step log
(`json`) needs none of this: it keeps the escape \\u0000 verbatim.
"""

from __future__ import annotations

import json
import re
from typing import Any

MARKER = "_encoding"
SCHEME = "nul-percent"

_ENCODED = re.compile("%(00|25)")


def has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(has_nul(v) for v in value)
    return False


def encode(value: Any) -> Any:
    """`value` as it can be stored in jsonb: unchanged unless a string in it holds a NUL; then
    the object is percent-encoded and marked. Only objects can carry the marker: a bare string
    or array with a NUL is returned unchanged (the database will refuse it). `_encoding` is
    reserved at the top level of events and results (RunJournal.emit refuses it)."""
    if not isinstance(value, dict) or not has_nul(value):
        return value
    encoded = _encode_all(value)
    encoded[MARKER] = SCHEME
    return encoded


def encode_sized(value: Any) -> tuple[Any, int]:
    """`encode(value)` and the length of its JSON text (`json.dumps`), from one dump in C: the
    text shows the escape `\\u0000` wherever a string holds a NUL, so only a value whose text
    holds it (a NUL, or a backslash written before `u0000`) is walked in Python. The journal
    writer sizes its calls by that length, so it encodes each event once, not twice."""
    text = json.dumps(value)
    if "\\u0000" not in text:
        return value, len(text)
    encoded = encode(value)
    return encoded, len(text) if encoded is value else len(json.dumps(encoded))


def decode(value: Any) -> Any:
    """The value as the writer meant it: every marked object (at any depth) decoded."""
    if isinstance(value, dict):
        if value.get(MARKER) == SCHEME:
            return {_decode_str(k): _decode_all(v) for k, v in value.items() if k != MARKER}
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def _encode_all(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("%", "%25").replace("\x00", "%00")
    if isinstance(value, dict):
        return {_encode_all(k): _encode_all(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode_all(v) for v in value]
    return value


def _decode_str(text: str) -> str:
    return _ENCODED.sub(lambda m: "\x00" if m.group(1) == "00" else "%", text)


def _decode_all(value: Any) -> Any:
    if isinstance(value, str):
        return _decode_str(value)
    if isinstance(value, dict):
        return {_decode_str(k): _decode_all(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_all(v) for v in value]
    return value


def printable(text: str | None) -> str | None:
    """A message for a text column (an error): a NUL in it becomes U+FFFD, the rest is kept."""
    return None if text is None else text.replace("\x00", "\ufffd")
