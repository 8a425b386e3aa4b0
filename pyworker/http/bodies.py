"""Request input: JSON bodies under a size cap, ids in paths, typed fields.

Python only filters here (types, sizes, unknown fields, integer ranges, text PostgreSQL cannot
store) so a mistake gets a message naming the field, whatever the value; the SQL functions
stay the authority on every value.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from starlette.requests import ClientDisconnect, Request

from pyworker.db.storable import Fault, find_unstorable, short, text_fault
from pyworker.http.errors import ApiError, not_found


async def read_json_object(request: Request, limit: int, *, required: bool = True) -> dict[str, Any]:
    """The body as a JSON object; 413 past `limit` bytes, 415 for a non-JSON type (or none, for
    a body that is not empty), 400 if malformed."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype and ctype != "application/json" and not ctype.endswith("+json"):
        raise ApiError(415, "unsupported_media_type", f"send the body as application/json, not {ctype}")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:  # a chunked body has no Content-Length to check up front
                raise _too_large(limit)
    except ClientDisconnect:
        # The client hung up before its body ended (or sent a chunk uvicorn could not read):
        # nothing to act on, and nobody to answer; not a server error to log with a traceback.
        raise ApiError(
            400, "incomplete_body", "the connection closed before the request body ended"
        ) from None
    if body and not ctype:
        # Any page may make a browser send a body without Content-Type to any origin (fetch,
        # mode "no-cors", a byte body): taken for JSON, it enqueued a forged run (the web
        # audit). With the JSON type, another site's page needs a CORS preflight, never granted.
        raise ApiError(
            415,
            "unsupported_media_type",
            "the request body has no Content-Type: send it as Content-Type: application/json",
        )
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


async def read_no_fields(request: Request, limit: int) -> None:
    """A route that takes no fields: an empty body or `{}`, checked like any other body (413,
    415, 400), so that a malformed request is refused before it acts, as a body with fields is."""
    body = await read_json_object(request, limit, required=False)
    if body:
        name = short(sorted(body)[0])
        raise ApiError(400, "invalid_request", f"unknown field {name!r}: this endpoint takes no fields")


def reject_unknown_query(request: Request, allowed: frozenset[str]) -> None:
    """A query parameter the route does not read is a mistake to name (`?after=3` for `?from=3`
    streamed from the start), as an unknown body field is."""
    names = request.query_params.keys()
    unknown = sorted(set(names) - allowed)
    if unknown:
        takes = f"it takes {', '.join(sorted(allowed))}" if allowed else "it takes none"
        raise ApiError(400, "invalid_request", f"unknown query parameter {short(unknown[0])!r}: {takes}")
    # Given twice (`?from=5&from=6`), the last one was taken without a word (the HTTP audit).
    twice = sorted({name for name in names if len(request.query_params.getlist(name)) > 1})
    if twice:
        raise ApiError(400, "invalid_request", f"query parameter {short(twice[0])!r} is given more than once")


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


MAX_JSON_DEPTH = 64  # levels of arrays and objects in one field; content blocks and schemas need far fewer


def integer(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    """body[name] as an integer in low..high (None if absent); 400 naming the field otherwise. The
    range is checked here because an out-of-range JSON number would not even reach the function's
    own check (a value past int4 is a bigint, and no such function exists)."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = _kind(value) if isinstance(value, bool) or not isinstance(value, int) else short(str(value))
        raise ApiError(400, "invalid_request", f"{name} must be an integer from {low} to {high}, not {shown}")
    return value


def text(body: dict[str, Any], name: str, what: str, max_chars: int | None = None) -> str | None:
    """body[name] as a string PostgreSQL can store (None if absent); 400 naming the field otherwise."""
    value = field(body, name, str, what)
    if value is None:
        return None
    check_text(value, name)
    if max_chars is not None and len(value) > max_chars:
        raise ApiError(400, "invalid_request", f"{name} must be at most {max_chars} characters")
    return value


def check_text(value: str, where: str) -> None:
    """PostgreSQL text and jsonb hold neither U+0000 nor a lone surrogate (which JSON can spell)."""
    fault = text_fault(value)
    if fault is not None:
        raise ApiError(400, "invalid_request", f"{where} {_TEXT_FAULTS[fault]}")


_TEXT_FAULTS = {
    Fault.NUL: "must not contain the character U+0000 (NUL)",
    Fault.SURROGATE: "must be valid Unicode text, not a lone surrogate (\\ud800-\\udfff)",
}


def check_json(value: Any, name: str) -> None:
    """A JSON field PostgreSQL's jsonb can store: text as check_text says (keys too), finite
    numbers (json.loads reads 1e400 as infinity), at most MAX_JSON_DEPTH levels."""
    found = find_unstorable(value, name, MAX_JSON_DEPTH)
    if found is None:
        return
    if found.fault is Fault.TOO_DEEP:
        message = f"{name} is nested too deeply: at most {MAX_JSON_DEPTH} levels"
    elif found.fault is Fault.NOT_FINITE:
        message = f"{found.path} must be a finite number"
    else:
        where = f"{found.path} (a key)" if found.in_key else found.path
        message = f"{where} {_TEXT_FAULTS[found.fault]}"
    raise ApiError(400, "invalid_request", message)


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
