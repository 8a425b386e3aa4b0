"""Reading the Messages API's rate-limit headers (pyworker/agent/ratelimit_headers.py): the
requests bucket at remaining 0 blocks the key until one request is back, (reset − date) / limit
by the API's own clock, at most 60 s; the token buckets block nothing; anything missing, garbled
or already past blocks nothing and raises nothing."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from pyworker.agent.ratelimit_headers import (
    MAX_BLOCK_SECONDS,
    Exhausted,
    buckets,
    exhausted,
    input_tokens_limit,
)

DATE = "Wed, 01 Jan 2025 00:00:00 GMT"
P = "anthropic-ratelimit-"


def answer(**buckets_: tuple[Any, Any, Any]) -> dict[str, str]:
    """Headers of a response: per bucket (limit, remaining, reset), None leaving one out."""
    headers = {"date": DATE}
    for name, values in buckets_.items():
        for field, value in zip(("limit", "remaining", "reset"), values, strict=True):
            if value is not None:
                headers[f"{P}{name.replace('_', '-')}-{field}"] = str(value)
    return headers


def test_a_bucket_with_requests_left_blocks_nothing() -> None:
    headers = answer(requests=(50, 1, "2025-01-01T00:00:30Z"))
    assert exhausted(headers) is None
    [bucket] = buckets(headers)
    assert (bucket.name, bucket.remaining, bucket.limit, bucket.reset_in) == ("requests", 1, 50, 30.0)


def test_an_empty_bucket_blocks_until_one_request_is_back_by_the_apis_clock() -> None:
    # The date is the API's: whatever the worker's clock says, the wait is (reset − date) / limit,
    # the bucket refilling evenly to full at its reset.
    assert exhausted(answer(requests=(50, 0, "2025-01-01T00:00:05Z"))) == Exhausted("requests", 0.1, 50)
    quarter = answer(requests=(5, 0, "2025-01-01T00:00:05.250+00:00"))
    assert exhausted(quarter) == Exhausted("requests", 1.05, 5)
    assert exhausted(answer(requests=(1, 0, "2025-01-01T01:00:05+01:00"))) == Exhausted("requests", 5.0, 1)


def test_the_token_buckets_block_nothing() -> None:
    # When the next request fits depends on its size: the API's 429 says (retry-after).
    tokens_only = answer(
        input_tokens=(40000, 0, "2025-01-01T00:00:20Z"),
        output_tokens=(8000, 0, "2025-01-01T00:00:50Z"),
        tokens=(48000, 0, "2025-01-01T00:00:09Z"),
    )
    assert exhausted(tokens_only) is None
    assert [b.name for b in buckets(tokens_only)] == ["input-tokens", "output-tokens", "tokens"]
    both = answer(requests=(10, 0, "2025-01-01T00:00:02Z"), input_tokens=(40000, 0, "2025-01-01T00:00:20Z"))
    assert exhausted(both) == Exhausted("requests", 0.2, 10)


def test_header_names_are_case_insensitive_as_http_has_them() -> None:
    headers = httpx2.Headers(
        {
            "Date": DATE,
            f"{P}Requests-Remaining": "0",
            f"{P}requests-LIMIT": "2",
            f"{P}requests-RESET": "2025-01-01T00:00:07Z",
        }
    )
    assert exhausted(headers) == Exhausted("requests", 3.5, 2)


def test_a_huge_reset_is_capped_at_a_minute() -> None:
    assert exhausted(answer(requests=(50, 0, "9999-12-31T23:59:59Z"))) == Exhausted(
        "requests", MAX_BLOCK_SECONDS, 50
    )
    assert exhausted(answer(requests=(1, 0, "2025-01-01T00:01:00.5Z"))) == Exhausted("requests", 60.0, 1)


@pytest.mark.parametrize("reset", ["2025-01-01T00:00:00Z", "2024-12-31T23:59:00Z", "0001-01-01T00:00:00Z"])
def test_a_reset_already_past_blocks_nothing(reset: str) -> None:
    assert exhausted(answer(requests=(50, 0, reset))) is None


@pytest.mark.parametrize("remaining", ["", "zero", "-1", "0.0", "0, 0", "٠", "+0", "1e3", "9" * 40, " "])
def test_a_garbled_remaining_is_ignored(remaining: str) -> None:
    headers = answer(requests=(50, remaining, "2025-01-01T00:00:05Z"))
    assert exhausted(headers) is None
    assert buckets(headers) == []


@pytest.mark.parametrize(
    "reset",
    ["", "soon", "2025-01-01T00:00:05", "2025-13-01T00:00:05Z", "1735689605", "x" * 10_000, DATE],
)
def test_a_garbled_or_naive_reset_is_ignored(reset: str) -> None:
    headers = answer(requests=(50, 0, reset))
    assert exhausted(headers) is None
    assert buckets(headers)[0].reset_in is None


@pytest.mark.parametrize(
    "date", [None, "", "yesterday", "Wed, 01 Jan 2025 00:00:00 -0000", "2025-01-01T00:00:00Z", "x" * 10_000]
)
def test_without_a_readable_date_nothing_is_blocked(date: str | None) -> None:
    # The worker's clock is never compared with the API's: no date, no wait to compute.
    headers = answer(requests=(50, 0, "2025-01-01T00:00:05Z"))
    if date is None:
        del headers["date"]
    else:
        headers["date"] = date
    assert exhausted(headers) is None


def test_a_garbled_limit_still_blocks_until_the_reset() -> None:
    assert exhausted(answer(requests=("many", 0, "2025-01-01T00:00:05Z"))) == Exhausted("requests", 5.0)
    assert exhausted(answer(requests=("0", 0, "2025-01-01T00:00:05Z"))) == Exhausted("requests", 5.0)
    assert buckets(answer(requests=("many", 0, None)))[0].limit is None
    # No limit, no pace: the wait is to the full reset, not one request's refill.
    assert exhausted(answer(requests=("0", 0, "2025-01-01T00:00:05Z"))).limit is None  # type: ignore[union-attr]


@pytest.mark.parametrize("headers", [None, {}, {"date": DATE}, {f"{P}requests-remaining": "0"}])
def test_no_headers_block_nothing(headers: Any) -> None:
    assert exhausted(headers) is None


def test_values_that_are_not_strings_are_ignored() -> None:
    headers: dict[str, Any] = {"date": DATE, f"{P}requests-remaining": 0, f"{P}requests-reset": None}
    assert exhausted(headers) is None and buckets(headers) == []


@pytest.mark.parametrize(
    ("message", "limit"),
    [
        # The API's two wordings of an input-tokens-per-minute 429 (2025 and 2026).
        (
            "This request would exceed the rate limit for your organization "
            "(a22cf6e6-a940-4fff-8c4c-1580816ac7be) of 1,000,000 input tokens per minute. For details, ...",
            1_000_000,
        ),
        (
            "This request would exceed your organization's rate limit of 30,000 input tokens per minute "
            "(org: ef36bf5a-434a-4c52-b7a0-ba958aef9dfd, model: claude-sonnet-4-20250514). For details, ...",
            30_000,
        ),
        ("Number of request tokens has exceeded your per-minute rate limit", None),
        ("This request would exceed the rate limit for your organization of 50 requests per minute.", None),
    ],
)
def test_a_429_states_its_input_tokens_limit_in_its_message(message: str, limit: int | None) -> None:
    assert input_tokens_limit(None, message) == limit


def test_a_429s_input_tokens_limit_header_comes_first() -> None:
    headers = httpx2.Headers({"anthropic-ratelimit-input-tokens-limit": "4000"})
    assert input_tokens_limit(headers, "... of 30,000 input tokens per minute") == 4000
    assert input_tokens_limit(httpx2.Headers({"anthropic-ratelimit-input-tokens-limit": "x"}), "") is None


def test_a_429_about_another_limit_states_no_input_tokens_limit_whatever_its_headers() -> None:
    """The input limit's header comes with every 429 (a requests-per-minute one too): read
    alone, it failed runs for their size when only their number of requests was refused."""
    headers = httpx2.Headers({"anthropic-ratelimit-input-tokens-limit": "4000"})
    assert input_tokens_limit(headers, "Number of requests has exceeded your rate limit") is None
    assert (
        input_tokens_limit(
            headers, "rate_limit_error: Number of request tokens has exceeded your per-minute rate limit"
        )
        is None
    )
    assert (
        input_tokens_limit(headers, "This request would exceed your rate limit of input tokens per minute.")
        == 4000
    )
