"""JSON read and written back with its numbers exact: the text of a webhook payload re-encoded.

`json.loads` reads 12345678901234567.89 as the float 1.2345678901234568e+16 and
1.00000000000000000001 as 1.0, so a body re-encoded from it said other numbers than the run
stored (a result from another language's worker, metadata written over SQL: the webhooks
audit). Here a number with a fraction or an exponent is read as an ExactNumber, which keeps its
text, and `dumps` writes that text back as it came; integers are Python ints, exact already.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from decimal import Decimal
from json.encoder import encode_basestring
from typing import Any


class ExactNumber(Decimal):
    """A JSON number as written: its value (a Decimal) and its text, which `dumps` sends."""

    text: str

    def __new__(cls, text: str) -> ExactNumber:
        number = super().__new__(cls, text)
        number.text = text
        return number


def loads(text: str) -> Any:
    """json.loads with each non-integer number an ExactNumber. ValueError and RecursionError as
    json.loads (too many digits for an int, nested past the recursion limit)."""
    return json.loads(text, parse_float=ExactNumber)


def dumps(value: Any) -> str:
    """json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False,
    allow_nan=False), but with an ExactNumber written as its text. ValueError for NaN or an
    infinity, which JSON cannot say; RecursionError past the recursion limit."""
    parts: list[str] = []
    _write(value, parts.append)
    return "".join(parts)


def _write(value: Any, out: Callable[[str], Any]) -> None:
    if isinstance(value, str):
        out(encode_basestring(value))
    elif value is None:
        out("null")
    elif value is True:
        out("true")
    elif value is False:
        out("false")
    elif isinstance(value, ExactNumber):
        out(value.text)
    elif isinstance(value, int):
        out(int.__repr__(value))
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"JSON has no {value!r}")
        out(float.__repr__(value))
    elif isinstance(value, dict):
        out("{")
        for i, (key, item) in enumerate(sorted(value.items())):
            if not isinstance(key, str):
                raise TypeError(f"a JSON object's keys are strings, not {type(key).__name__}")
            out("," if i else "")
            out(encode_basestring(key))
            out(":")
            _write(item, out)
        out("}")
    elif isinstance(value, list | tuple):
        out("[")
        for i, item in enumerate(value):
            out("," if i else "")
            _write(item, out)
        out("]")
    else:
        raise TypeError(f"{type(value).__name__} is not JSON")
