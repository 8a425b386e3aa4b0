"""The fake's requests-per-minute limit: a token bucket like the real API's, with a 429 and
`retry-after` (whole seconds, rounded up) / `retry-after-ms` when it is empty, and the list of
requests it refused (for the tests and bench/rate_limits.py).

    FakeModel(rate_limit=RateLimit(requests=5, per_seconds=1.0))   # 5 a second, burst 5

`per_seconds` scales the minute so a test runs in seconds.

Like the real API, every /v1/messages response (the 429s too) states the bucket:
`anthropic-ratelimit-requests-limit`, `-remaining` (whole requests left after this one) and
`-reset` (RFC 3339, whole seconds rounded up: when the bucket is full again), beside the
response's `date` (whole seconds, truncated; the server adds it to every response). Both come
from the same reading of the wall clock, so reset − date is never shorter than the true wait.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import formatdate

PREFIX = "anthropic-ratelimit-requests-"


@dataclass(frozen=True)
class Refusal:
    at: float  # time.monotonic() of the refusal
    retry_after: float  # seconds the 429 asked for


@dataclass(frozen=True)
class Answer:
    """take()'s verdict on one request, and the bucket as it left it."""

    wait: float | None  # None: allowed; else the retry-after of the 429, in seconds
    limit: int
    remaining: int  # whole requests left
    full_in: float  # seconds until the bucket is full again
    wall: float  # time.time() of the verdict
    stated: bool = True  # False: the bucket headers are left out (RateLimit.state_headers)

    def headers(self) -> dict[str, str]:
        """The rate-limit headers of the response, with its `date`."""
        reset = datetime.fromtimestamp(math.ceil(self.wall + self.full_in), UTC)
        headers = {"date": formatdate(math.floor(self.wall), usegmt=True)}
        if self.stated:
            headers |= {
                f"{PREFIX}limit": str(self.limit),
                f"{PREFIX}remaining": str(self.remaining),
                f"{PREFIX}reset": reset.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        if self.wait is not None:
            headers.update(RateLimit.headers(self.wait))
        return headers


@dataclass
class RateLimit:
    requests: int
    per_seconds: float = 60.0
    # False: answers state no bucket (as a gateway in front of the API may strip them), so a
    # fleet meets the limit only by its 429s: what the 429 path's own tests need.
    state_headers: bool = True
    _tokens: float = field(init=False)
    _at: float = field(init=False)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    refused: list[Refusal] = field(init=False, default_factory=list)
    allowed: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.requests < 1 or not self.per_seconds > 0:
            raise ValueError("rate limit: requests must be >= 1 and per_seconds > 0")
        self._tokens = float(self.requests)
        self._at = time.monotonic()

    def take(self) -> Answer:
        """One request: allowed (a token taken) or refused (Answer.wait: the 429's retry-after)."""
        rate = self.requests / self.per_seconds
        with self._lock:
            now = time.monotonic()
            self._tokens = min(float(self.requests), self._tokens + (now - self._at) * rate)
            self._at = now
            wait: float | None = None
            if self._tokens >= 1:
                self._tokens -= 1
                self.allowed += 1
            else:
                wait = (1 - self._tokens) / rate
                self.refused.append(Refusal(now, wait))
            full_in = (self.requests - self._tokens) / rate
            left = math.floor(self._tokens)
            return Answer(wait, self.requests, left, full_in, time.time(), self.state_headers)

    @staticmethod
    def headers(wait: float) -> dict[str, str]:
        return {
            "retry-after": str(max(1, math.ceil(wait))),
            "retry-after-ms": str(max(1, round(wait * 1000))),
        }
