"""Prompt caching in the agent loop (issue 16): where the breakpoints go, that they stay request
decoration (the step log and conversation_history never hold them), and what a run reads from the
fake's cache: a 12-step run reads its pinned prefix and earlier history from the second request
on, and a run SIGKILLed after step 5 and resumed by another worker process reads its whole prefix
and writes nothing it had already written."""

from __future__ import annotations

import copy
import itertools
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from agent_support import (
    QUICK_TAKEOVER,
    TOOLS,
    ForkedWorker,
    agent_env,
    enqueue_agent,
    in_process_worker,
    steps,
)
from worker_support import db, run_row, wait_status, wait_until, worker_db

from pyworker.agent.model import request_params
from pyworker.agent.prompt_cache import add_breakpoints, cache_mode
from pyworker.db.api import ClaimedRun
from pyworker.fake.faults import slow
from pyworker.fake.server import FakeModel, RecordedRequest

__all__ = ["db", "worker_db"]

TERMINAL = {"completed", "failed", "dead"}
# ~3,000 tokens (bytes/4): a system prompt well past the 1,024-token minimum of the Sonnet class.
LONG_SYSTEM = "You are a careful assistant. Check every file you read against the house rules. " * 150
FIVE = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}


def markers(value: Any, path: str = "") -> list[str]:
    """Where the cache_control markers are, as paths into the request."""
    if isinstance(value, dict):
        own = [path] if "cache_control" in value else []
        return own + [p for k, v in value.items() for p in markers(v, f"{path}.{k}" if path else k)]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in markers(v, f"{path}.{i}")]
    return []


def cache_usage(request: RecordedRequest) -> tuple[int, int, int]:
    assert request.response is not None
    u = request.response["usage"]
    return u["input_tokens"], u["cache_creation_input_tokens"], u["cache_read_input_tokens"]


# -- where the breakpoints go ------------------------------------------------------------------


def tool_loop_params() -> dict[str, Any]:
    thinking = {"type": "thinking", "thinking": "Hm.", "signature": "sig"}
    return {
        "model": "m",
        "max_tokens": 10,
        "system": "Be careful.",
        "tools": [{"name": "t", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "Do it."},
            {
                "role": "assistant",
                "content": [thinking, {"type": "tool_use", "id": "a", "name": "t", "input": {}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "1"}]},
            {
                "role": "assistant",
                "content": [thinking, {"type": "tool_use", "id": "b", "name": "t", "input": {}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "b", "content": "2"}]},
        ],
    }


def test_breakpoints_end_the_pinned_prefix_the_previous_request_and_this_one() -> None:
    params = tool_loop_params()
    before = copy.deepcopy(params)
    out = add_breakpoints(params, "5m")
    assert params == before  # the loop's History (and so the step log) never sees a marker
    assert markers(out) == ["system.0", "messages.2.content.0", "messages.4.content.0"]
    assert out["system"] == [{"type": "text", "text": "Be careful.", "cache_control": FIVE}]
    assert out["messages"][4]["content"][0]["cache_control"] == FIVE
    assert out["messages"][:2] == params["messages"][:2]
    hour = add_breakpoints(params, "1h")
    assert {json.dumps(hour["system"][0]["cache_control"])} == {'{"type": "ephemeral", "ttl": "1h"}'}
    assert add_breakpoints(params, "off") is params


def test_first_request_and_paused_turns_and_thinking_blocks() -> None:
    first = {
        "model": "m",
        "max_tokens": 10,
        "tools": [{"name": "t"}],
        "messages": [{"role": "user", "content": "Hi"}],
    }
    out = add_breakpoints(first, "5m")
    # No system prompt: the pinned breakpoint goes on the last tool; a string becomes one text block.
    assert markers(out) == ["tools.0", "messages.0.content.0"]
    assert out["messages"][0]["content"] == [{"type": "text", "text": "Hi", "cache_control": FIVE}]
    paused = tool_loop_params()
    paused["messages"].append(
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": "s"}]}
    )
    paused["messages"].append(
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "So far"},
                {"type": "thinking", "thinking": "y", "signature": "s"},
            ],
        }
    )
    # A thinking block cannot carry a marker: the last block that can does.
    assert markers(add_breakpoints(paused, "5m"))[-1] == "messages.6.content.0"


def test_never_more_than_four_counting_the_users_own() -> None:
    params = tool_loop_params()
    params["messages"][0] = {
        "role": "user",
        "content": [{"type": "text", "text": f"part {i}", "cache_control": FIVE} for i in range(2)],
    }
    out = add_breakpoints(params, "5m")
    assert len(markers(out)) == 4
    assert markers(out)[-1] == "messages.4.content.0"  # the final message's comes first


def test_no_one_hour_marker_follows_a_five_minute_one() -> None:
    """The API refuses a request whose 1-hour marker comes after a 5-minute one (tools, system,
    messages). A user's 1-hour marker after our default 5-minute one on the system prompt failed
    the turn, and every later turn of the conversation, whose history holds it. Such a marker
    becomes a 5-minute one (the fake refuses the order, as the API does)."""
    from pyworker.fake.cache import prompt_units

    params = tool_loop_params()
    params["messages"][0] = {
        "role": "user",
        "content": [{"type": "text", "text": "keep this an hour", "cache_control": HOUR}],
    }
    before = copy.deepcopy(params)
    for mode in ("5m", "off"):
        out = add_breakpoints(params, mode)
        prompt_units(out)  # raises the API's 400 if a 1-hour marker follows a 5-minute one
        assert out["messages"][0]["content"][0]["cache_control"] == (FIVE if mode == "5m" else HOUR)
    assert params == before
    # Our 1-hour markers after a user's 5-minute one in the history: ours become 5-minute ones.
    params["messages"][0]["content"][0]["cache_control"] = FIVE
    out = add_breakpoints(params, "1h")
    prompt_units(out)
    assert out["system"][0]["cache_control"] == HOUR  # before the user's: kept
    assert out["messages"][4]["content"][0]["cache_control"] == FIVE


def test_the_run_metadata_picks_the_mode() -> None:
    assert cache_mode({}) == "5m" and cache_mode(None) == "5m"
    assert cache_mode({"prompt_cache": "off"}) == "off" and cache_mode({"prompt_cache": "1h"}) == "1h"
    ids = uuid.uuid4()
    run = ClaimedRun(
        ids, ids, ids, 1, 1, "m", "p", "S", None, None, ids, {"prompt_cache": "off"}, datetime.now(UTC)
    )
    assert markers(request_params(run, [{"role": "user", "content": "Hi"}])) == []


def test_enqueue_refuses_an_unknown_prompt_cache_and_writes_nothing(db: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"metadata\.prompt_cache must be one of"):
        enqueue_agent(db, metadata={"prompt_cache": "forever"})


# -- a 12-step run against the fake ------------------------------------------------------------


def test_a_12_step_run_reads_the_pinned_prefix_and_the_earlier_history_from_the_cache(
    db: psycopg.Connection, worker_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNROW_DEMO_DIR", str(tmp_path))
    with FakeModel("demo") as fake:
        config = {"tools_module": TOOLS, "anthropic_base_url": fake.base_url, "anthropic_api_key": "k"}
        with in_process_worker(worker_db, config=config):
            run = enqueue_agent(db, system=LONG_SYSTEM)
            assert wait_status(db, run, TERMINAL, 60) == "completed"
        requests = fake.requests
    assert len(steps(db, run)) == 12 and len(requests) == 6
    assert all(r.status == 200 for r in requests)
    first_in, first_written, first_read = cache_usage(requests[0])
    assert (first_in, first_read) == (0, 0) and first_written > 3000  # tools + system + the task
    pinned = None
    for previous, request in itertools.pairwise(requests):
        _, written, read = cache_usage(request)
        _, prev_written, prev_read = cache_usage(previous)
        # Everything the previous request sent (pinned prefix and history) is read; only the turn
        # and the tool results since then are written; nothing is billed at the full price.
        assert read == prev_read + prev_written, request.number
        assert 0 < written < 1000 and cache_usage(request)[0] == 0
        assert len(markers(request.body)) == 3
        pinned = pinned or request.body["system"]
        assert request.body["system"] == pinned
    # Request decoration only: nothing stored carries a marker, and the history read back holds none.
    assert not [seq for seq, _, text in steps(db, run) if "cache_control" in text]
    history = db.execute(
        "SELECT h.payload::text FROM runrow.get_run(%s) AS r, "
        "runrow.conversation_history(conversation_id => r.conversation_id, up_to_run_id => r.id) AS h",
        (run,),
    ).fetchall()
    assert len(history) == 13 and not [t for (t,) in history if "cache_control" in t]
    # The step log keeps each turn's usage as the API reported it; run_usage sums it.
    totals = db.execute("SELECT * FROM runrow.run_usage(%s)", (run,)).fetchone()
    sent = [r.response["usage"] for r in requests if r.response]
    assert totals == (
        6,
        sum(u["input_tokens"] for u in sent),
        sum(u["output_tokens"] for u in sent),
        sum(u["cache_read_input_tokens"] for u in sent),
        sum(u["cache_creation_input_tokens"] for u in sent),
    )
    stored = db.execute(
        "SELECT usage FROM runrow.agent_step WHERE run_id = %s AND kind = 'model_turn' ORDER BY seq", (run,)
    ).fetchall()
    assert [u["cache_creation"] for (u,) in stored] == [u["cache_creation"] for u in sent]


# -- killed after step 5, resumed by another worker process ------------------------------------


def test_a_run_killed_after_step_5_and_resumed_reads_its_whole_prefix_from_the_cache(
    db: psycopg.Connection, worker_db: str, tmp_path: Path
) -> None:
    with FakeModel("demo") as fake:
        # Request 3 (after step 5) streams slowly, so the kill lands while it is under way: the
        # fake has processed (and cached) its prompt, the turn it answers is never committed.
        fake.inject(None, None, slow(0.5))
        env = agent_env(fake.base_url, tmp_path)
        a = ForkedWorker(worker_db, "a", env, **QUICK_TAKEOVER)
        b: ForkedWorker | None = None
        try:
            run: uuid.UUID = enqueue_agent(db, system=LONG_SYSTEM)
            wait_until(
                lambda: len(steps(db, run)) >= 5 and len(fake.requests) >= 3 and fake.requests[2].response,
                30,
                "step 5 and request 3 under way",
            )
            a.kill()
            assert len(steps(db, run)) == 5 and not fake.requests[2].outcome
            b = ForkedWorker(worker_db, "b", env, **QUICK_TAKEOVER)
            assert wait_status(db, run, TERMINAL, 30) == "completed"
        finally:
            a.kill()
            if b is not None:
                b.kill()
        requests = fake.requests
    assert run_row(db, run)["attempt"] == 2 and len(steps(db, run)) == 12
    killed, resumed = requests[2], requests[3]
    assert resumed.body == killed.body  # rebuilt from the step log: the same bytes, the same markers
    _, killed_written, killed_read = cache_usage(killed)
    assert killed_written > 0 and killed_read > 3000
    # The resumed request reads everything the killed one had cached and writes nothing.
    assert cache_usage(resumed) == (0, 0, killed_read + killed_written)
    for request in requests[4:]:  # and the run goes on reading
        assert cache_usage(request)[2] >= killed_read + killed_written
