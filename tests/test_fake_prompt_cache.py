"""The fake Messages API's prompt cache, through the real `anthropic` SDK: hits, misses on a changed
byte, TTL expiry on the fake's injectable clock, the minimum cacheable length, the breakpoint rules."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from pyworker.fake.cache import min_cacheable
from pyworker.fake.server import FakeModel

MODEL = "claude-fake-1"  # Sonnet/Opus class: 1024 tokens minimum
LONG = "Follow the house rules to the letter. " * 160  # ~1,500 tokens (bytes/4)
TOOLS = [{"name": "lookup", "description": "Look a thing up.", "input_schema": {"type": "object"}}]
EPHEMERAL = {"type": "ephemeral"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake(clock: Clock) -> Iterator[FakeModel]:
    with FakeModel("text", clock=clock) as server:
        yield server


@pytest.fixture
def client(fake: FakeModel) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=fake.base_url, api_key="test", max_retries=0) as c:
        yield c


def request(
    system: str = LONG, question: str = "hi", *, ttl: str | None = None, model: str = MODEL, **extra: Any
) -> dict[str, Any]:
    marker = dict(EPHEMERAL, **({"ttl": ttl} if ttl else {}))
    return {
        "model": model,
        "max_tokens": 64,
        "tools": TOOLS,
        "system": [{"type": "text", "text": system, "cache_control": marker}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": question, "cache_control": marker}]}
        ],
        **extra,
    }


def usage(client: anthropic.Anthropic, body: dict[str, Any]) -> dict[str, Any]:
    with client.messages.stream(**body) as stream:
        message = stream.get_final_message()
    return message.usage.to_dict()


def split(u: dict[str, Any]) -> tuple[int, int, int]:
    return u["input_tokens"], u["cache_creation_input_tokens"], u["cache_read_input_tokens"]


def test_a_miss_writes_up_to_the_last_breakpoint_and_the_same_prompt_then_reads_it(
    client: anthropic.Anthropic,
) -> None:
    first = usage(client, request())
    total = first["cache_creation_input_tokens"]
    assert split(first) == (0, total, 0) and total > 1024
    assert first["cache_creation"] == {"ephemeral_5m_input_tokens": total, "ephemeral_1h_input_tokens": 0}
    assert split(usage(client, request())) == (0, 0, total)
    # A longer conversation reads the cached prefix and writes only what is new.
    longer = request()
    longer["messages"] += [
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": [{"type": "text", "text": "more " * 40, "cache_control": EPHEMERAL}]},
    ]
    _, written, read = split(usage(client, longer))
    assert read == total and 0 < written < 100


def test_a_changed_byte_before_a_breakpoint_is_a_miss_after_it_a_hit(client: anthropic.Anthropic) -> None:
    first = usage(client, request())
    changed = usage(client, request(system=LONG[:-1] + "!"))
    assert changed["cache_read_input_tokens"] == 0
    assert changed["cache_creation_input_tokens"] == first["cache_creation_input_tokens"]
    # The system prompt's breakpoint is still cached; only the question after it changed.
    other_question = usage(client, request(question="ho"))
    pinned = other_question["cache_read_input_tokens"]
    assert 1024 < pinned < first["cache_creation_input_tokens"]
    assert other_question["cache_creation_input_tokens"] == first["cache_creation_input_tokens"] - pinned
    # A different model has its own cache.
    assert usage(client, request(model="claude-fake-2"))["cache_read_input_tokens"] == 0


def test_entries_expire_after_their_ttl_and_a_hit_restarts_it(
    client: anthropic.Anthropic, clock: Clock
) -> None:
    total = usage(client, request())["cache_creation_input_tokens"]
    clock.now += 299
    assert usage(client, request())["cache_read_input_tokens"] == total  # and 5 more minutes from now
    clock.now += 299
    assert usage(client, request())["cache_read_input_tokens"] == total
    clock.now += 301
    assert split(usage(client, request())) == (0, total, 0)  # expired: written again

    hour = usage(client, request(question="an hour", ttl="1h"))
    assert hour["cache_creation"]["ephemeral_1h_input_tokens"] == hour["cache_creation_input_tokens"] > 0
    clock.now += 3599
    assert usage(client, request(question="an hour", ttl="1h"))["cache_creation_input_tokens"] == 0
    clock.now += 3601
    assert usage(client, request(question="an hour", ttl="1h"))["cache_read_input_tokens"] == 0


def test_a_prefix_below_the_minimum_cacheable_length_is_not_cached(client: anthropic.Anthropic) -> None:
    assert min_cacheable("claude-fake-1") == 1024 and min_cacheable("claude-3-5-haiku-latest") == 2048
    short = request(system="Be brief.")
    assert split(usage(client, short))[1:] == (0, 0)
    assert split(usage(client, short))[1:] == (0, 0)  # nothing was written, so nothing is read
    # ~1,500 tokens: cacheable for the Sonnet class, not for Haiku (2,048).
    assert usage(client, request(model="claude-3-5-haiku-latest"))["cache_creation_input_tokens"] == 0
    doubled = request(system=LONG * 2, model="claude-3-5-haiku-latest")
    assert usage(client, doubled)["cache_creation_input_tokens"] > 2048
    # Without any breakpoint, nothing is cached and every input token is billed.
    plain = {
        "model": MODEL,
        "max_tokens": 64,
        "system": LONG,
        "messages": [{"role": "user", "content": "hi"}],
    }
    u = usage(client, plain)
    assert u["cache_creation_input_tokens"] == u["cache_read_input_tokens"] == 0 and u["input_tokens"] > 1024


def test_breakpoint_rules_are_the_apis(client: anthropic.Anthropic) -> None:
    five = request()
    five["messages"] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": f"q{i}", "cache_control": EPHEMERAL} for i in range(4)],
        }
    ]
    with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks with cache_control"):
        usage(client, five)
    mixed = request()
    mixed["messages"][0]["content"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    with pytest.raises(anthropic.BadRequestError, match=r"ttl='1h'.*must not come after.*ttl='5m'"):
        usage(client, mixed)
    bad_ttl = request()
    bad_ttl["system"][0]["cache_control"] = {"type": "ephemeral", "ttl": "10m"}
    with pytest.raises(anthropic.BadRequestError, match=r"system\.0\.cache_control\.ttl"):
        usage(client, bad_ttl)
