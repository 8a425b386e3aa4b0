"""The range of every numeric setting of a worker, and the choices of the others, shared by
Worker and WebhookSettings (which check what they are given, with `check`) and by `runrow
worker`'s flags (which refuse a value out of range as a usage error naming the flag). A module of
its own so that the command line reads them without importing the worker.
"""

from __future__ import annotations

# The worker's own settings. Where a SQL function takes the value, its own range: claim_runs'
# max_runs (concurrency), the lease of claim and heartbeat, reap_expired_runs' grace_seconds;
# outside them a worker fails on every call. The clocks have a floor because at 0 they spin (a
# 0 s poll is thousands of claim commits a second) and a ceiling of a day (`inf` and `nan` are
# not clocks). trim_after is in seconds here (hours on the command line); 100 years is far
# inside trim_journal's interval range.
LIMITS: dict[str, tuple[type, float, float]] = {
    "concurrency": (int, 1, 1000),
    "lease_seconds": (int, 1, 3600),
    "grace_seconds": (int, 0, 86400),
    "poll_seconds": (float, 0.1, 86400),
    "reap_interval": (float, 0.1, 86400),
    "drain_seconds": (float, 0, 86400),
    "trim_after": (float, 0, 100 * 365 * 86400),
    "flush_interval": (float, 0.01, 60),
    "pool_size": (int, 1, 1000),
    # The agent loop's cap on the model calls of one run (worker config `max_model_calls`,
    # `runrow worker --max-model-calls`): a safety net for a loop that never answers.
    "max_model_calls": (int, 1, 100_000),
    # An API key or account error's fleet-wide block (worker config; report_key_error's own
    # range): a value it refuses raised 22023 inside the handler, and every key error then
    # became "handler raised", spending an attempt.
    "key_error_first_block": (float, 0.001, 86400),
    "key_error_max_block": (float, 0.001, 86400),
    # report_key_error's give_up_after_seconds (migration 0110): how long a run refused with the
    # same 403 as other runs of its key waits before its refusal is taken for its own request.
    "key_error_give_up": (float, 600, 604800),
}
DEFAULT_MAX_MODEL_CALLS = 100

# The webhook sender's settings: the SQL functions' own ranges where they take the value
# (max_attempts 1..100, backoff_seconds 0.1..3600, max_per_receiver 1..1000).
WEBHOOK_LIMITS: dict[str, tuple[type, float, float]] = {
    "webhook_timeout": (float, 0.1, 600),
    "webhook_attempts": (int, 1, 100),
    "webhook_backoff": (float, 0.1, 3600),
    "webhook_poll": (float, 0.1, 86400),
    "webhook_per_receiver": (int, 1, 1000),
}
# Deliveries in flight to one receiver (scheme://host:port) over the whole fleet: fewer than a
# worker's 10 sender slots, so one receiver that hangs leaves the others slots on every worker.
DEFAULT_WEBHOOK_PER_RECEIVER = 4
# What signs a delivery (--webhook-signing): the fleet secret, the key derived from it for the
# run's user (pyworker.worker.webhook_signing), or both, one v1 each. fleet is what receivers
# had before there was a choice.
WEBHOOK_SIGNING_MODES = ("fleet", "user", "both")
DEFAULT_WEBHOOK_SIGNING = "fleet"


def check(name: str, value: object) -> None:
    """ValueError naming the setting and its range unless `value` is in LIMITS[name] or
    WEBHOOK_LIMITS[name]: a number (not a bool), an int where the setting counts things."""
    kind, lo, hi = LIMITS[name] if name in LIMITS else WEBHOOK_LIMITS[name]
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or (kind is int and not isinstance(value, int)) or not lo <= value <= hi:  # type: ignore[operator]
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"{name} must be {what} from {lo:g} to {hi:g}, got {value!r}")
