"""What `never_fits` counts of a request against the input tokens per minute a 429 states
(pyworker/agent/uncached_input.py): no base64 payload, no prefix the prompt cache may serve."""

from __future__ import annotations

from typing import Any

from pyworker.agent.limits import estimate_input_tokens
from pyworker.agent.uncached_input import uncached_input_tokens

MARK = {"type": "ephemeral"}
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A" * 400_000}}


def text(chars: int, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": "x" * chars, **extra}


def test_a_request_without_payload_or_breakpoint_counts_as_the_plain_estimate() -> None:
    params = {"system": "s" * 4000, "messages": [{"role": "user", "content": "x" * 8000}]}
    assert abs(uncached_input_tokens(params) - estimate_input_tokens(params)) < 50


def test_base64_payloads_do_not_count_even_inside_a_tool_result() -> None:
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [IMAGE, text(40)]}
    params = {
        "messages": [{"role": "user", "content": [IMAGE, text(40)]}, {"role": "user", "content": [result]}]
    }
    assert estimate_input_tokens(params) > 200_000
    assert uncached_input_tokens(params) < 200


def test_a_url_source_and_a_text_document_still_count() -> None:
    document = {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "d" * 8000},
    }
    assert uncached_input_tokens({"messages": [{"role": "user", "content": [document]}]}) > 2000


def test_what_comes_before_the_last_breakpoint_may_be_read_from_the_cache() -> None:
    params = {
        "tools": [{"name": "t", "input_schema": {"type": "object"}, "description": "d" * 40_000}],
        "system": [text(40_000, cache_control=MARK)],
        "messages": [{"role": "user", "content": [text(400, cache_control=MARK)]}],
    }
    assert uncached_input_tokens(params) < 200  # the final block's own breakpoint is a write


def test_a_breakpoint_on_the_final_block_alone_caches_nothing_read() -> None:
    params = {
        "system": "s" * 40_000,
        "messages": [{"role": "user", "content": [text(400, cache_control=MARK)]}],
    }
    assert uncached_input_tokens(params) > 10_000


def test_a_breakpoint_inside_a_tool_result_ends_a_cached_prefix() -> None:
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [text(40_000, cache_control=MARK)]}
    params = {"system": "s" * 40_000, "messages": [{"role": "user", "content": [result, text(40)]}]}
    assert uncached_input_tokens(params) < 100
