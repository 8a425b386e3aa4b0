"""How long a run released after a retryable model failure waits before it may be claimed again.

Exponential per attempt with jitter (half fixed, half random, so a fleet that failed together
does not come back together), capped; when the API said how long to wait (retry-after), that
wait, plus up to 10 % jitter for the same reason. The database applies it
(release_run(retry_in => ...)): the delay is measured on its clock, not ours.
"""

from __future__ import annotations

import random
from collections.abc import Callable

BASE_SECONDS = 1.0
CAP_SECONDS = 300.0
MAX_RETRY_IN = 86400.0  # release_run's limit


def retry_in(
    attempt: int,
    retry_after: float | None = None,
    *,
    base: float = BASE_SECONDS,
    cap: float = CAP_SECONDS,
    rng: Callable[[], float] = random.random,
) -> float:
    """Seconds of backoff after attempt `attempt` (1-based) failed; always > 0."""
    if retry_after is not None and retry_after > 0:
        return min(MAX_RETRY_IN, retry_after * (1 + 0.1 * rng()))
    ceiling = min(cap, base * 2 ** max(0, min(attempt - 1, 30)))
    return max(0.001, ceiling / 2 + ceiling / 2 * rng())
