"""Faults the fake Messages API can inject, each one a thing the real API or the network does.

`status`: an HTTP error before any body (429 rate_limit_error, 529 overloaded_error, 500 api_error),
with `retry-after` (whole seconds, rounded up, as the real API sends) and `retry-after-ms` (which the
SDK prefers, so tests can retry after a few milliseconds).
`error_event`: a 200 stream that sends `after_events` events, then `event: error`, then ends.
`drop`: a 200 stream that sends `after_events` events, then closes the socket mid-body.
`end`: a 200 stream that sends `after_events` events, then ends the body cleanly (the chunked
encoding's last chunk) with no `message_stop`: what a proxy or load balancer that closes an SSE
response gracefully produces. The SDK raises nothing; its final message is a partial snapshot.
`slow`: a normal answer with `delay` seconds before each streamed event.
`tool_json`: a 200 stream whose tool_use blocks stream `raw` as their input JSON (e.g. `{"city": Oslo}`):
a model's tool input that does not parse, which the SDK raises as a ValueError mid-stream.
`garbled`: a 200 stream that sends `after_events` events, then an event whose `data:` is not JSON,
then ends (the SDK raises the JSON decode error).
An account fault (`FakeModel.set_account_error`) is a `status` fault answered to every request
until it is cleared, as the real API answers every request of a revoked key or an account out of
credit: `invalid_api_key()` (401 authentication_error), `billing_error()` (402),
`credit_balance_too_low()` (the API's 400 invalid_request_error for an empty balance),
`permission_denied()` (403 permission_error).
Without `stream: true` there is no body to cut: `drop`, `end` and `garbled` close the connection
before any response (the SDK retries that as a connection error), `error_event` answers 529
overloaded_error, and `tool_json` is served normally.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

KINDS = ("status", "error_event", "drop", "end", "slow", "tool_json", "garbled")

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}

MESSAGES = {
    "rate_limit_error": "Number of request tokens has exceeded your per-minute rate limit",
    "overloaded_error": "Overloaded",
    "api_error": "Internal server error",
    "authentication_error": "invalid x-api-key",
    "billing_error": "Your credit balance is too low to access the Anthropic API.",
    "permission_error": "Your API key does not have permission to use the specified resource.",
}

# The real API's answer to a request of an account whose prepaid credit ran out: a 400, not a
# 402, so only its message says it is about the account.
CREDIT_BALANCE_TOO_LOW = (
    "Your credit balance is too low to access the Anthropic API. "
    "Please go to Plans & Billing to upgrade or purchase credits."
)


@dataclass(frozen=True)
class Fault:
    kind: str
    status: int = 529
    error_type: str = "overloaded_error"
    message: str = "Overloaded"
    retry_after: float | None = None
    after_events: int = 3
    delay: float = 0.0
    raw: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault kind must be one of {KINDS}, not {self.kind!r}")

    def retry_headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {
            "retry-after": str(max(1, math.ceil(self.retry_after))),
            "retry-after-ms": str(max(1, round(self.retry_after * 1000))),
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fault:
        return cls(**dict(data))


def status_error(status: int, retry_after: float | None = None, message: str | None = None) -> Fault:
    error_type = ERROR_TYPES.get(status, "api_error")
    return Fault(
        "status",
        status=status,
        error_type=error_type,
        message=message or MESSAGES.get(error_type, error_type),
        retry_after=retry_after,
    )


def rate_limited(retry_after: float | None = 0.01) -> Fault:
    return status_error(429, retry_after)


def overloaded(retry_after: float | None = 0.01) -> Fault:
    return status_error(529, retry_after)


def server_error(retry_after: float | None = 0.01) -> Fault:
    return status_error(500, retry_after)


def error_event(
    after_events: int = 3, error_type: str = "overloaded_error", message: str = "Overloaded"
) -> Fault:
    return Fault("error_event", status=200, error_type=error_type, message=message, after_events=after_events)


def drop_connection(after_events: int = 3) -> Fault:
    return Fault("drop", status=200, after_events=after_events)


def end_stream(after_events: int = 3) -> Fault:
    return Fault("end", status=200, after_events=after_events)


def bad_tool_json(raw: str = '{"city": Oslo}') -> Fault:
    return Fault("tool_json", status=200, raw=raw)


def garbled(after_events: int = 3) -> Fault:
    return Fault("garbled", status=200, after_events=after_events)


def slow(delay: float = 0.05) -> Fault:
    return Fault("slow", status=200, delay=delay)


def invalid_api_key() -> Fault:
    return status_error(401)


def billing_error() -> Fault:
    return status_error(402)


def credit_balance_too_low() -> Fault:
    return status_error(400, message=CREDIT_BALANCE_TOO_LOW)


def permission_denied(message: str | None = None) -> Fault:
    return status_error(403, message=message)
