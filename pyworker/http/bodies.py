"""Request input: JSON bodies under a size cap, ids in paths, typed fields.

Python only filters here (types, sizes, unknown fields) so a mistake gets a message naming
the field; the SQL functions stay the authority on every value.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from starlette.requests import Request

from pyworker.http.errors import ApiError, not_found


async def read_json_object(request: Request, limit: int, *, required: bool = True) -> dict[str, Any]:
    """The body as a JSON object; 413 past `limit` bytes, 415 for a non-JSON type, 400 if malformed."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype and ctype != "application/json" and not ctype.endswith("+json"):
        raise ApiError(415, "unsupported_media_type", f"send the body as application/json, not {ctype}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:  # a chunked body has no Content-Length to check up front
            raise _too_large(limit)
    if not body.strip():
        if required:
            raise ApiError(400, "invalid_request", "the request body must be a JSON object")
        return {}
    try:
        value = json.loads(bytes(body), parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, "malformed_json", f"the request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(400, "invalid_request", f"the request body must be a JSON object, not {_kind(value)}")
    return value


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "body_too_large", f"the request body is larger than {limit} bytes")


def path_uuid(request: Request, name: str, what: str) -> UUID:
    """A path id; one that is not a UUID names nothing, so it is a 404 like an unknown id."""
    raw = request.path_params[name]
    try:
        return UUID(raw)
    except ValueError:
        raise not_found(what, raw) from None


def reject_unknown(body: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(
            400,
            "invalid_request",
            f"unknown field {unknown[0]!r}; allowed fields: {', '.join(sorted(allowed))}",
        )


def field(body: dict[str, Any], name: str, types: type | tuple[type, ...], what: str) -> Any:
    """body[name] if present (None if absent or null); 400 naming the field for a wrong type."""
    value = body.get(name)
    if value is None:
        return None
    # bool is an int in Python, never in JSON.
    wrong_bool = isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,))
    if wrong_bool or not isinstance(value, types):
        raise ApiError(400, "invalid_request", f"{name} must be {what}, not {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
