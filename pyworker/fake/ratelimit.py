"""The fake's requests-per-minute limit: a token bucket like the real API's, with a 429 and
`retry-after` (whole seconds, rounded up) / `retry-after-ms` when it is empty, and the list of
requests it refused (for the tests and bench/rate_limits.py).

    FakeModel(rate_limit=RateLimit(requests=5, per_seconds=1.0))   # 5 a second, burst 5

`per_seconds` scales the minute so a test runs in seconds.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Refusal:
    at: float  # time.monotonic() of the refusal
    retry_after: float  # seconds the 429 asked for


@dataclass
class RateLimit:
    requests: int
    per_seconds: float = 60.0
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

    def take(self) -> float | None:
        """None: allowed (one request taken). Else the retry-after of the 429, in seconds."""
        rate = self.requests / self.per_seconds
        with self._lock:
            now = time.monotonic()
            self._tokens = min(float(self.requests), self._tokens + (now - self._at) * rate)
            self._at = now
            if self._tokens >= 1:
                self._tokens -= 1
                self.allowed += 1
                return None
            wait = (1 - self._tokens) / rate
            self.refused.append(Refusal(now, wait))
            return wait

    @staticmethod
    def headers(wait: float) -> dict[str, str]:
        return {
            "retry-after": str(max(1, math.ceil(wait))),
            "retry-after-ms": str(max(1, round(wait * 1000))),
        }
