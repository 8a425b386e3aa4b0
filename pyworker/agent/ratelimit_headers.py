"""What the Messages API's rate-limit headers say about the organisation's buckets.

Every response, a success or a 429, carries for each bucket `anthropic-ratelimit-<bucket>-limit`,
`-remaining` and `-reset` (RFC 3339: when the bucket is full again), for the buckets
requests, input-tokens, output-tokens and tokens, and a `date` header. The requests bucket at
remaining 0 refuses every request until one refills: `exhausted` says for how long, so the fleet
waits (pyworker/agent/limits.py, report_rate_limit_exhausted) instead of learning it from a 429.

The wait comes from reset − date, both the API's clock: the worker's own clock is never compared with
the API's (a worker a few seconds off would block too long, or not at all). The `date` header
has whole seconds and is truncated, so the wait errs long by under a second, never short.

Headers are the API's, read defensively: a missing, garbled or contradictory one is ignored,
never an error; a response without them blocks nothing (the 429 path still catches a limit).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime

PREFIX = "anthropic-ratelimit-"
BUCKETS = ("requests", "input-tokens", "output-tokens", "tokens")
# The API's rate limits are per-minute token buckets (requests, input and output tokens per
# minute): an empty one is full again within 60 s of its own clock. A reset further out is not
# one of them (a misread header, the API's clock jumping, a limit this code does not know), and
# blocking every worker of the key on it for longer would stall the fleet on a misreading: if the
# bucket is still empty after 60 s, the next request's 429 says so, with its retry-after.
MAX_BLOCK_SECONDS = 60.0
# Shorter waits are not worth a database write: the next request finds the bucket refilled.
MIN_BLOCK_SECONDS = 0.001


@dataclass(frozen=True)
class Bucket:
    name: str  # requests, input-tokens, output-tokens, tokens
    remaining: int
    limit: int | None  # None when absent or garbled
    reset_in: float | None  # seconds from the response's date to the reset; None if unknown


@dataclass(frozen=True)
class Exhausted:
    bucket: str  # the empty bucket: requests
    seconds: float  # how long to block the key: until one request is back, at most MAX_BLOCK_SECONDS
    # The bucket's limit when the response states it: `seconds` is then the API's pace (one
    # request back per `seconds`), which the fleet keeps after the block (report_rate_limit_exhausted).
    limit: int | None = None


def buckets(headers: Mapping[str, str] | None) -> list[Bucket]:
    """The buckets whose `remaining` the response states (a non-negative integer)."""
    if headers is None:
        return []
    date = _http_date(_header(headers, "date"))
    found: list[Bucket] = []
    for name in BUCKETS:
        remaining = _count(_header(headers, f"{PREFIX}{name}-remaining"))
        if remaining is None:
            continue
        reset = _rfc3339(_header(headers, f"{PREFIX}{name}-reset"))
        reset_in = None if reset is None or date is None else (reset - date).total_seconds()
        found.append(Bucket(name, remaining, _count(_header(headers, f"{PREFIX}{name}-limit")), reset_in))
    return found


def exhausted(headers: Mapping[str, str] | None) -> Exhausted | None:
    """The block the response calls for: the requests bucket at remaining 0 with its reset still
    ahead of the response's date, blocked until one request is back; None otherwise.

    The reset is when the bucket is FULL again, and the API refills it evenly (a token bucket),
    so one request is back after reset_in / limit. Blocking to the full reset idled the fleet
    for most of a window the API would have served a request in every limit-th of (with the
    fake's 3 requests a second, a drain took twice as long). Without a readable limit: to the
    reset. The token buckets block nothing: when the next request fits depends on its size,
    which only the API's 429 (its retry-after) says; at 0 input tokens left a small request may
    pass at once, a large one not for most of a minute."""
    for bucket in buckets(headers):
        if bucket.name != "requests" or bucket.remaining != 0 or bucket.reset_in is None:
            continue
        seconds = bucket.reset_in / bucket.limit if bucket.limit else bucket.reset_in
        if not seconds >= MIN_BLOCK_SECONDS:
            return None  # a reset already past: nothing to wait for
        return Exhausted(bucket.name, min(seconds, MAX_BLOCK_SECONDS), bucket.limit or None)
    return None


# How the API's 429 for an input-tokens-per-minute limit names the limit ("This request would
# exceed the rate limit for your organization (<org>) of 30,000 input tokens per minute", or
# "... exceed your organization's rate limit of 30,000 input tokens per minute (org: ...)").
INPUT_LIMIT_WORDING = re.compile(r"rate limit\b.{0,80}? of ([0-9][0-9,]{0,15}) input tokens per minute", re.S)
INPUT_LIMIT_NAMED = re.compile(r"\binput tokens per minute\b", re.I)


def input_tokens_limit(headers: Mapping[str, str] | None, message: str) -> int | None:
    """The organisation's input tokens per minute, when a 429 is about that limit: only when its
    message names it, and then its `anthropic-ratelimit-input-tokens-limit` header, else the
    number in its wording; None for a 429 about another limit (requests, output tokens) or one
    that does not say, whatever headers come with it: the API sends the input limit's header
    with a requests-per-minute 429 too, and that 429 says nothing about the request's size."""
    if INPUT_LIMIT_NAMED.search(message) is None:
        return None
    limit = _count(_header(headers, f"{PREFIX}input-tokens-limit")) if headers is not None else None
    if limit:
        return limit
    found = INPUT_LIMIT_WORDING.search(message)
    if found is None:
        return None
    return _count(found.group(1).replace(",", "")) or None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    try:
        value = headers.get(name)
    except Exception:
        return None
    return value if isinstance(value, str) else None


def _count(raw: str | None) -> int | None:
    """A non-negative integer as the API writes it ("0", "4000"), else None."""
    if raw is None:
        return None
    text = raw.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        return None
    return int(text)


def _rfc3339(raw: str | None) -> datetime | None:
    """An RFC 3339 time with its offset ("2025-01-01T00:00:05Z"); None for anything else (a
    time without an offset names no instant)."""
    if raw is None or len(raw) > 64:
        return None
    try:
        value = datetime.fromisoformat(raw.strip())
    except ValueError:
        return None
    return value if value.tzinfo is not None else None


def _http_date(raw: str | None) -> datetime | None:
    """The `date` header (RFC 9110 IMF-fixdate, "Wed, 01 Jan 2025 00:00:00 GMT")."""
    if raw is None or len(raw) > 64:
        return None
    try:
        value = parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return value if value.tzinfo is not None else None
