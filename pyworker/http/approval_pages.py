"""GET /approvals' paging: `?limit=` (default 100, at most 1000) and `?after=`, the opaque
cursor of the page before (its `next`).

The cursor is the last row's (waiting_since, idempotency_key), the list's ORDER BY, in
URL-safe base64 without padding: a client passes it back as it got it and reads nothing into
it. A value this service could not have given is a 400 naming the parameter.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import datetime

from pyworker.http.errors import ApiError

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
_DIGITS = re.compile(r"[0-9]{1,7}")  # ASCII only: int() also reads "١٠" and " 1_0 "
_KEY = re.compile(r"[0-9a-f]{64}")  # runrow.tool_call_key's form
_MAX_CURSOR = 200  # characters; a cursor given is about 120


def limit_of(raw: str | None) -> int:
    if raw is None or raw == "":
        return DEFAULT_LIMIT
    if not _DIGITS.fullmatch(raw) or not 1 <= int(raw) <= MAX_LIMIT:
        raise ApiError(
            400, "invalid_request", f"limit must be an integer from 1 to {MAX_LIMIT}, not {raw[:40]!r}"
        )
    return int(raw)


def cursor(waiting_since: datetime, idempotency_key: str) -> str:
    text = f"{waiting_since.isoformat()}|{idempotency_key}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def after_of(raw: str | None) -> tuple[datetime, str] | None:
    if raw is None or raw == "":
        return None
    try:
        if len(raw) > _MAX_CURSOR:
            raise ValueError
        text = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode("ascii")
        when, _, key = text.partition("|")
        waiting_since = datetime.fromisoformat(when)
        if waiting_since.tzinfo is None or not _KEY.fullmatch(key):
            raise ValueError
    except (ValueError, binascii.Error):  # UnicodeDecodeError is a ValueError
        raise ApiError(
            400,
            "invalid_request",
            "after must be the `next` of a page GET /approvals answered, as it was given",
        ) from None
    return waiting_since, key
