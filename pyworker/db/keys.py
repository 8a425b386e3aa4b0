"""The idempotency key of a tool call, the Python twin of `runrow.tool_call_key`.

The key is derived from the call's position in the run, so every attempt at the same
call computes the same key and a different call never does:

    sha256_hex(utf8(f"{run_id}:{step_seq}:{tool_use_id}:{tool}:{canonical_json(args)}"))

`run_id` is the lowercase hyphenated UUID, `step_seq` the seq of the model_turn step that
holds the tool_use block, `tool_use_id` that block's id, `tool` its name, `args` its input.
`canonical_json` is `json.dumps(args, sort_keys=True, separators=(",", ":"),
ensure_ascii=False)` with one difference: numbers are written in plain decimal as
PostgreSQL's numeric prints them (1e2 -> 100, 1e-07 -> 0.0000001, 1.50 -> 1.50,
-0.0 -> 0.0), because that is what the database sees after parsing the JSON it is sent.
For ints and for floats whose repr has no exponent the two are identical.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from decimal import Decimal
from typing import Any


def canonical_json(value: Any) -> str:
    """Canonical JSON text of a decoded JSON value (see the module docstring)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float | Decimal):
        return _plain_number(value)
    if isinstance(value, dict):
        items = sorted(value.items())
        for key, _ in items:
            if not isinstance(key, str):
                raise TypeError(f"JSON object keys must be strings, got {type(key).__name__}")
        return (
            "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{canonical_json(v)}" for k, v in items) + "}"
        )
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _plain_number(value: float | Decimal) -> str:
    # A float goes over the wire as its repr; PostgreSQL parses that into numeric, which
    # keeps the digits and scale but prints them without an exponent and has no -0.
    number = Decimal(repr(value)) if isinstance(value, float) else value
    if not number.is_finite():
        raise ValueError(f"JSON has no {value!r}")
    if number.is_zero():
        number = abs(number)
    return format(number, "f")


def tool_call_key(
    run_id: uuid.UUID | str, step_seq: int, tool_use_id: str, tool: str, args: dict[str, Any]
) -> str:
    """The idempotency key `runrow.tool_call_key(run_id, step_seq, tool_use_id, tool, args)` returns."""
    if not isinstance(args, dict):
        raise TypeError("args must be a JSON object (a tool_use block's input)")
    material = f"{uuid.UUID(str(run_id))}:{int(step_seq)}:{tool_use_id}:{tool}:{canonical_json(args)}"
    return hashlib.sha256(material.encode("utf-8")).hexdigest()
