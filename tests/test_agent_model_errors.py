"""What the agent loop does with a response it cannot use, with the real SDK against the fake
Messages API and a real worker (in-process): every failure is classified (never "handler
raised"), a response that was billed is paid for, a failure that would recur ends the run once,
and a transient one is retried with a backoff.

- a tool input the model streamed that is not JSON (the SDK's ValueError mid-stream): released
  with a backoff, spending an attempt (failed once on the default single attempt), the error
  naming the tool and the input, the response paid for;
- an SSE event whose data is not JSON: a transient failure, released with a backoff, paid for;
- an `error` event mid-stream: overloaded_error / api_error are retried, rate_limit_error is a
  429 (reported, waited out in the attempt), any other type fails the run once, paid for;
- more 429s in one attempt than MAX_429_IN_ATTEMPT: the run is deferred, its attempt given back;
- stop_reason stop_sequence: the sequence that fired is in the result and the model_turn event.
"""

from __future__ import annotations

import base64
import json
import logging
import random
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from agent_support import InProcessWorker, enqueue_agent, fake, fake_api_worker, module_conn, module_db, steps
from worker_support import events, run_row, wait_status

from pyworker.agent.limits import MAX_429_DEFERRALS, MAX_429_IN_ATTEMPT
from pyworker.agent.tools import ToolRegistry, tool
from pyworker.fake.faults import bad_tool_json, error_event, garbled, rate_limited, status_error
from pyworker.fake.scenarios import Text, ToolCall, script, turn
from pyworker.fake.server import FakeModel

__all__ = ["fake", "module_conn", "module_db"]

TERMINAL = {"completed", "failed", "cancelled", "dead"}
WEATHER = {
    "name": "get_weather",
    "description": "Weather of a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
registry = ToolRegistry()


@tool(input_schema=WEATHER["input_schema"], description="Weather.", effect="pure", into=registry)
def get_weather(city: str, idempotency_key: str) -> dict[str, Any]:
    return {"city": city, "sky": "sunny"}


@pytest.fixture(scope="module")
def worker(module_db: str, fake: FakeModel) -> Iterator[InProcessWorker]:
    config = {"registry": registry}
    with fake_api_worker(module_db, fake, "modelerr", config, lease_seconds=2, concurrency=2) as w:
        yield w


@pytest.fixture
def db(module_conn: psycopg.Connection, fake: FakeModel, worker: InProcessWorker) -> psycopg.Connection:
    fake.reset()
    fake.set_scenario("text")
    return module_conn


def finish(db: psycopg.Connection, run: uuid.UUID, timeout: float = 30) -> dict[str, Any]:
    wait_status(db, run, TERMINAL, timeout)
    return run_row(db, run)


def spent(db: psycopg.Connection, run: uuid.UUID) -> int:
    return int(db.execute("SELECT spent_tokens FROM runrow.agent_run WHERE id = %s", (run,)).fetchone()[0])


def billed_input(fake: FakeModel, number: int = 0) -> int:
    response = fake.requests[number].response
    assert response is not None
    return int(response["usage"]["input_tokens"])


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """A classified failure is logged as a warning, not as "handler raised" with a traceback."""
    raised = [r.getMessage() for r in caplog.records if r.exc_info or "handler raised" in r.getMessage()]
    assert raised == [], raised


def requeue_delays(db: psycopg.Connection, run: uuid.UUID) -> list[dict[str, Any]]:
    return [e for e in events(db, run) if e["type"] == "run_requeued"]


# -- what the stream raises that is not an API error ------------------------------------------


def test_a_tool_input_that_is_not_json_fails_once_on_one_attempt_naming_the_tool_and_is_paid_for(
    db, fake, caplog
) -> None:
    """The SDK raises ValueError("Unable to parse tool parameter JSON from model...") mid-stream.
    It escaped unclassified: "handler raised", released at once, the billed response never
    counted; with max_attempts 3 the run was dead after three paid answers, spend 0 (the agent
    audit). With the default max_attempts 1 it fails once, paid once."""
    caplog.set_level(logging.WARNING)
    fake.set_scenario(script(turn(Text("Checking."), ToolCall("get_weather", {"city": "Oslo"}))))
    fake.inject(*[bad_tool_json('{"city": Oslo}')] * 3)
    run = enqueue_agent(db, "Weather?", tools=[WEATHER], metadata={}, max_attempts=1)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("failed", 1), row
    # The input as far as the SDK had it when it could not parse it: the fake streams 12 characters a delta.
    assert '{"city": Osl' in row["error"], row["error"]
    assert "the model's input for the tool get_weather is not valid JSON" in row["error"], row["error"]
    assert len(fake.requests) == 1
    assert steps(db, run) == []  # nothing of the response is stored
    assert spent(db, run) >= billed_input(fake) > 0
    no_traceback(caplog)


def test_a_tool_input_that_is_not_json_is_asked_again_while_attempts_are_left(db, fake, caplog) -> None:
    """It failed the run at once even with attempts left (the review of 97011fe): the model
    samples, and asked again it usually answers valid JSON; max_attempts is the operator's
    bound on what that costs. Released with a backoff, spending an attempt; both answers paid."""
    caplog.set_level(logging.WARNING)
    fake.set_scenario(
        script(turn(Text("Checking."), ToolCall("get_weather", {"city": "Oslo"})), turn(Text("Sunny.")))
    )
    fake.inject(bad_tool_json('{"city": Oslo}'))
    run = enqueue_agent(db, "Weather?", tools=[WEATHER], metadata={}, max_attempts=2)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 2), row
    [requeued] = requeue_delays(db, run)
    assert requeued.get("not_before") is not None and not requeued.get("deferred"), requeued
    assert "get_weather is not valid JSON" in requeued["error"], requeued
    assert spent(db, run) >= billed_input(fake, 0) + billed_input(fake, 1) > 0
    no_traceback(caplog)


def test_a_long_unparsable_tool_input_is_cut_in_the_error(db, fake) -> None:
    fake.set_scenario(script(turn(ToolCall("get_weather", {"city": "Oslo"}))))
    fake.inject(bad_tool_json('{"city": "' + "x" * 5000 + '", "unit": celsius}'))
    run = enqueue_agent(db, "Weather?", tools=[WEATHER], metadata={}, max_attempts=1)
    row = finish(db, run)
    assert row["status"] == "failed" and "get_weather" in row["error"], row
    assert len(row["error"]) < 700 and "…" in row["error"], row["error"]


def test_an_event_that_is_not_json_is_retried_with_a_backoff_and_paid_for(db, fake, caplog) -> None:
    """A JSON decode error on an SSE line escaped unclassified the same way: released with no
    backoff, the response's input never counted."""
    caplog.set_level(logging.WARNING)
    fake.inject(garbled(after_events=4))
    run = enqueue_agent(db, "Hi", tools=[], metadata={}, max_attempts=2)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 2), row
    [requeued] = requeue_delays(db, run)
    assert requeued.get("not_before") is not None, requeued  # a backoff, not at once
    assert fake.requests[0].outcome == "garbled"
    usage = db.execute("SELECT input_tokens, output_tokens FROM runrow.run_usage(%s)", (run,)).fetchone()
    assert spent(db, run) >= sum(usage) + billed_input(fake, 0), (spent(db, run), usage)
    no_traceback(caplog)


# -- an error event mid-stream ----------------------------------------------------------------


@pytest.mark.parametrize("error_type", ["overloaded_error", "api_error"])
def test_a_transient_error_event_is_retried(db, fake, error_type) -> None:
    fake.inject(error_event(after_events=4, error_type=error_type, message="try again"))
    run = enqueue_agent(db, "Hi", tools=[], metadata={}, max_attempts=2)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 2), row


@pytest.mark.parametrize("error_type", ["invalid_request_error", "not_found_error", "request_too_large"])
def test_an_error_event_that_would_recur_fails_once_and_is_paid_for(db, fake, error_type) -> None:
    """Every error event mid-stream was retried, so a request the API refuses was sent again
    (and paid for) on every attempt."""
    fake.inject(*[error_event(after_events=4, error_type=error_type, message="bad request")] * 2)
    run = enqueue_agent(db, "Hi", tools=[], metadata={}, max_attempts=2)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("failed", 1), row
    assert row["error"] == f"model stream error mid-response: {error_type}: bad request", row["error"]
    assert len(fake.requests) == 1
    assert spent(db, run) >= billed_input(fake) > 0


def test_a_rate_limit_error_event_is_a_429_waited_out_in_the_attempt(db, fake) -> None:
    fake.inject(error_event(after_events=4, error_type="rate_limit_error", message="slow down"))
    run = enqueue_agent(db, "Hi", model="claude-429-event", tools=[], metadata={}, max_attempts=1)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 1), row
    assert requeue_delays(db, run) == []
    reported = db.execute(
        "SELECT blocks_reported FROM runrow.rate_limit WHERE rate_limit_key = 'claude-429-event'"
    ).fetchone()
    assert reported == (1,)


# -- 429s past the attempt's cap --------------------------------------------------------------


def test_429s_past_the_attempts_cap_defer_the_run_without_spending_its_attempt(db, fake) -> None:
    """The sixth 429 in one attempt released the run and spent its attempt: with the default
    max_attempts 1 it failed "model API error (retries exhausted): HTTP 429", though a 429 is
    never billed and no run fails for having waited."""
    fake.inject(*[rate_limited(0.01)] * (MAX_429_IN_ATTEMPT + 1))
    run = enqueue_agent(db, "Hi", model="claude-429-cap", tools=[], metadata={}, max_attempts=1)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 1), row
    assert [r.status for r in fake.requests] == [429] * (MAX_429_IN_ATTEMPT + 1) + [200]
    [requeued] = requeue_delays(db, run)
    assert requeued["deferred"] is True and requeued["attempt"] == 0, requeued


def blocks_reported(db: psycopg.Connection, key: str) -> int:
    row = db.execute(
        "SELECT blocks_reported FROM runrow.rate_limit WHERE rate_limit_key = %s", (key,)
    ).fetchone()
    return 0 if row is None else int(row[0])


def test_429s_that_never_clear_spend_an_attempt_after_the_deferral_cap(db, fake) -> None:
    """Each deferral gave the attempt back with no cap, so a 429 that never clears looped
    without end, each 429 blocking the key for the whole fleet: 24 429s for a max_attempts 1
    run were 24 blocks and 4 deferrals, attempt still 1, and it went on (the review). Now the
    deferrals are counted in the run's journal (the worker's count dies with each claim), and
    past MAX_429_DEFERRALS the next trip past the attempt's cap spends the attempt."""
    per_claim = MAX_429_IN_ATTEMPT + 1
    fake.inject(*[rate_limited(0.01)] * (per_claim * (MAX_429_DEFERRALS + 1) + 5))
    run = enqueue_agent(db, "Hi", model="claude-429-forever", tools=[], metadata={}, max_attempts=1)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("failed", 1), row
    assert "429" in row["error"] and f"after {MAX_429_DEFERRALS} deferrals" in row["error"], row["error"]
    requeued = requeue_delays(db, run)
    assert [r["deferred"] for r in requeued] == [True] * MAX_429_DEFERRALS, requeued
    assert len(fake.requests) == per_claim * (MAX_429_DEFERRALS + 1)
    assert blocks_reported(db, "claude-429-forever") == per_claim * (MAX_429_DEFERRALS + 1)


# The real API's 429 for an input-tokens-per-minute limit (the wording since 2025; "Please reduce
# the prompt length" is in every such 429, a bucket merely empty included).
ITPM_429 = (
    "This request would exceed the rate limit for your organization "
    "(a22cf6e6-a940-4fff-8c4c-1580816ac7be) of {limit} input tokens per minute. For details, refer to: "
    "https://docs.anthropic.com/en/api/rate-limits. You can see the response headers for current usage. "
    "Please reduce the prompt length or the maximum tokens requested, or try again later."
)


def test_a_429_for_a_request_larger_than_the_keys_per_minute_limit_fails_once_blocking_nothing(
    db, fake
) -> None:
    """One request larger than the organisation's input tokens per minute gets the same 429
    every time: it was reported (the key blocked for the whole fleet) and waited out, 429 after
    429. Its input is more than the limit the 429 states: no wait cures it."""
    fake.inject(*[status_error(429, 0.01, ITPM_429.format(limit="1,000"))] * 30)
    run = enqueue_agent(db, "x" * 8000, model="claude-429-huge", tools=[], metadata={}, max_attempts=3)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("failed", 1), row
    assert row["error"].startswith("rate_limit: the request's input (about 2"), row["error"]
    assert "limit of 1000 input tokens per minute" in row["error"], row["error"]
    assert len(fake.requests) == 1
    assert blocks_reported(db, "claude-429-huge") == 0
    assert requeue_delays(db, run) == []


def test_the_same_429_for_a_request_that_fits_the_limit_is_waited_out(db, fake) -> None:
    fake.inject(status_error(429, 0.01, ITPM_429.format(limit="30,000")))
    run = enqueue_agent(db, "x" * 8000, model="claude-429-fits", tools=[], metadata={}, max_attempts=1)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 1), row
    assert blocks_reported(db, "claude-429-fits") == 1


def test_the_same_429_for_a_request_whose_size_is_a_base64_image_is_waited_out(db, fake) -> None:
    """The API counts an image by its pixels (about 1,600 tokens at most), not by its base64
    bytes: a 200 KB image's characters / 4 (66,721 "tokens") failed the run at a 30,000 limit,
    for a 429 that a wait cures (the review of 436ee21)."""
    data = base64.b64encode(random.Random(7).randbytes(150_000)).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    content = [image, {"type": "text", "text": "What is in this picture?"}]
    fake.inject(status_error(429, 0.01, ITPM_429.format(limit="30,000")))
    run = enqueue_agent(db, content, model="claude-429-image", tools=[], metadata={}, max_attempts=1)
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 1), row
    assert len(fake.requests) == 2
    assert blocks_reported(db, "claude-429-image") == 1


def test_the_same_429_for_a_first_turn_whose_size_is_a_cached_system_prompt_is_waited_out(db, fake) -> None:
    """Cache reads do not count toward the input tokens per minute: a first turn whose 160 KB
    system prompt (another run's, or this prompt's last request's, cache entry) is read from
    the cache fits a 30,000 limit though its characters / 4 are 40,020 (the review of 436ee21:
    failed). Its question alone is counted."""
    system = "You answer questions about the manual below.\n" + "The manual says little. " * 6_700
    fake.inject(status_error(429, 0.01, ITPM_429.format(limit="30,000")))
    run = enqueue_agent(
        db, "Hi", model="claude-429-cached", system=system, tools=[], metadata={}, max_attempts=1
    )
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("completed", 1), row
    assert len(fake.requests) == 2
    assert fake.requests[0].body["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert blocks_reported(db, "claude-429-cached") == 1


def test_the_same_429_for_a_large_first_turn_without_the_cache_still_fails_once(db, fake) -> None:
    """With prompt_cache off nothing is read from a cache: the system prompt counts."""
    system = "The manual says little. " * 6_700
    fake.inject(*[status_error(429, 0.01, ITPM_429.format(limit="30,000"))] * 30)
    run = enqueue_agent(
        db,
        "Hi",
        model="claude-429-uncached",
        system=system,
        tools=[],
        metadata={"prompt_cache": "off"},
        max_attempts=1,
    )
    row = finish(db, run)
    assert (row["status"], row["attempt"]) == ("failed", 1), row
    assert "limit of 30000 input tokens per minute" in row["error"], row["error"]
    assert len(fake.requests) == 1
    assert blocks_reported(db, "claude-429-uncached") == 0


# -- stop sequences ---------------------------------------------------------------------------


def test_the_stop_sequence_that_fired_is_in_the_result_and_the_model_turn_event(db, fake) -> None:
    fake.set_scenario(script(turn(Text("Hello there. STOP and more"))))
    run = enqueue_agent(db, "Hi", tools=[], metadata={"stop_sequences": ["END", "STOP"]})
    row = finish(db, run)
    assert row["status"] == "completed", row
    assert row["result"] == {"text": "Hello there. ", "stop_reason": "stop_sequence", "stop_sequence": "STOP"}
    [model_turn] = [e for e in events(db, run) if e["type"] == "model_turn"]
    assert (model_turn["stop_reason"], model_turn["stop_sequence"]) == ("stop_sequence", "STOP")
    [(_, _, payload)] = steps(db, run)
    assert json.loads(payload) == [{"type": "text", "text": "Hello there. "}]


def test_a_fork_at_a_stop_sequence_turn_ends_with_the_sequence_its_source_met(db, fake) -> None:
    # fork_run copies the steps, not the journal: the sequence that fired is read from the
    # copied step, whichever run of a chain of forks made it.
    fake.set_scenario(script(turn(Text("Hello there. STOP and more"))))
    source = enqueue_agent(db, "Hi", tools=[], metadata={"stop_sequences": ["END", "STOP"]})
    expected = finish(db, source)["result"]
    assert expected["stop_sequence"] == "STOP"
    run = source
    for _ in range(2):  # a fork, then a fork of the fork
        (run,) = db.execute(
            "SELECT new_run_id FROM runrow.fork_run(run_id => %s, at_seq => 1)", (run,)
        ).fetchone()
        row = finish(db, run)
        assert (row["status"], row["result"]) == ("completed", expected), row
    assert len(fake.requests) == 1  # neither fork asked the model again


def test_a_fork_of_a_run_whose_journal_was_trimmed_ends_with_the_sequence_its_source_met(db, fake) -> None:
    # The usual fork: of a run finished over a day ago, whose events every worker's reaper has
    # deleted (trim_journal). The sequence was read from the source's model_turn event, and the
    # fork ended without it.
    fake.set_scenario(script(turn(Text("Hello there. STOP and more"))))
    source = enqueue_agent(db, "Hi", tools=[], metadata={"stop_sequences": ["END", "STOP"]})
    expected = finish(db, source)["result"]
    assert expected["stop_sequence"] == "STOP"
    db.execute("SELECT runrow.trim_journal(older_than => interval '0')")
    assert events(db, source) == []
    (fork,) = db.execute(
        "SELECT new_run_id FROM runrow.fork_run(run_id => %s, at_seq => 1)", (source,)
    ).fetchone()
    row = finish(db, fork)
    assert (row["status"], row["result"]) == ("completed", expected), row
    assert len(fake.requests) == 1  # the fork did not ask the model again


def test_an_answer_that_meets_no_stop_sequence_has_none_in_its_result(db, fake) -> None:
    fake.set_scenario(script(turn(Text("Hello!"))))
    run = enqueue_agent(db, "Hi", tools=[], metadata={"stop_sequences": ["END"]})
    row = finish(db, run)
    assert row["result"] == {"text": "Hello!", "stop_reason": "end_turn"}, row
    [model_turn] = [e for e in events(db, run) if e["type"] == "model_turn"]
    assert "stop_sequence" not in model_turn
