"""Fleet limits end to end: the real SDK against the fake Messages API, real worker processes.

- 4 workers (2 runs each), 40 runs, a fake that allows 3 requests a second and answers the rest 429 +
  retry-after: once one worker reports the 429, the key is blocked fleet-wide, so during each
  block at most one more refused request per worker (the ones already in flight); and every
  run completes.
- A response whose rate-limit headers say the requests bucket is empty blocks the key until its
  reset: one worker, 8 runs, a fake that allows 2 every 2 s, and not one request refused.
- A run with a 2,000-token budget whose model keeps calling tools ends budget_exhausted after
  the step that crossed it, and no further model request is made.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

import anthropic
import psycopg
import pytest
from agent_support import (
    ForkedWorker,
    agent_env,
    enqueue_agent,
    in_process_worker,
    module_conn,
    module_db,
    steps,
)
from worker_support import run_row, streamed_text, wait_until

from pyworker.agent.model import FleetClient
from pyworker.agent.tools import ToolRegistry, tool
from pyworker.fake.faults import error_event, overloaded, rate_limited, server_error, slow
from pyworker.fake.ratelimit import RateLimit, Refusal
from pyworker.fake.scenarios import ModelRequest, Text, ToolCall, turn
from pyworker.fake.server import FakeModel
from pyworker.worker import metrics

__all__ = ["module_conn", "module_db"]

WORKERS = 4
RUNS = 40
PER_SECOND = 3
# One slot per worker: a worker can only take back requests it has not sent yet, so the bound
# "at most one more refused request per worker during a block" holds for one request in
# flight per worker. With more slots, every slot may have a granted request on the wire when
# the first 429 lands (seen under load: 6 refused in one block with 4 workers x 2 slots).
CONCURRENCY = 1
MODEL = "claude-fake-limited"


def episodes(refused: list[Refusal]) -> list[int]:
    """Refusals grouped by block: a block starts at a refusal not inside an earlier block and
    lasts that refusal's retry-after."""
    counts: list[int] = []
    until = float("-inf")
    for r in sorted(refused, key=lambda r: r.at):
        if r.at >= until:
            counts.append(0)
            until = r.at + r.retry_after
        counts[-1] += 1
    return counts


def test_a_429_blocks_the_key_fleet_wide_and_every_run_completes(
    module_conn: psycopg.Connection, tmp_path
) -> None:
    db = module_conn
    # The fleet knows the rate too: after the first 429 its bucket is empty and refills at
    # the fake's pace, so the workers stop bursting into the wall.
    db.execute("SELECT runrow.set_rate_limit(%s, %s, NULL, NULL)", (MODEL, PER_SECOND * 60))
    # An API that states no bucket in its headers: the fleet meets the limit by its 429s alone
    # (the headers' own block is the next test's).
    limit = RateLimit(requests=PER_SECOND, per_seconds=1.0, state_headers=False)
    with FakeModel("text", rate_limit=limit) as fake:
        runs = [
            enqueue_agent(db, f"run {i}", model=MODEL, tools=[], metadata={}, max_attempts=3)
            for i in range(RUNS)
        ]
        env = agent_env(fake.base_url, tmp_path)
        workers = [
            ForkedWorker(
                db.info.dsn,
                f"limits-{n}",
                env,
                concurrency=CONCURRENCY,
                lease_seconds=5,
                poll_seconds=0.3,
                reap_interval=1,
            )
            for n in range(WORKERS)
        ]
        try:
            wait_until(
                lambda: all(run_row(db, r)["status"] in ("completed", "failed", "dead") for r in runs),
                60,
                "every run ended",
                interval=0.2,
            )
        finally:
            for w in workers:
                w.stop()
        refused = list(limit.refused)
    statuses = [run_row(db, r)["status"] for r in runs]
    assert statuses == ["completed"] * RUNS
    blocks = episodes(refused)
    print(f"\n{RUNS} runs, {WORKERS} workers, {PER_SECOND}/s: {len(refused)} refused, per block {blocks}")
    assert refused, "the fake never refused: the test did not meet the limit"
    assert max(blocks) <= 1 + WORKERS, blocks


def test_a_response_saying_the_bucket_is_empty_blocks_the_key_before_any_429(
    module_conn: psycopg.Connection, module_db: str
) -> None:
    """The API states its buckets in every response's headers (anthropic-ratelimit-requests-
    remaining, -reset, date). Once one says remaining 0, every request before the reset is a
    certain 429: the worker blocks the key fleet-wide until the reset (reset − date, the API's
    clock), so the fleet sends none. The database knows no limit for the key: only the headers
    tell it. Before, the worker sent the next request at once and learned of the limit from the
    429 (6 of its 14 requests refused for 8 runs, the fake allowing 2 every 2 s); now none.
    One slot, so that no request is on the wire while the report commits."""
    db = module_conn
    model = f"claude-fake-headers-{uuid.uuid4().hex[:6]}"
    limit = RateLimit(requests=2, per_seconds=2.0)
    blocks = metrics.MODEL_RATE_LIMIT_EXHAUSTED.labels("requests")
    blocked_before = blocks._value.get()
    with FakeModel("text", rate_limit=limit) as fake:
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "k", "anthropic_max_retries": 0}
        with in_process_worker(module_db, "headers", config=config, lease_seconds=5, concurrency=1):
            runs = [
                enqueue_agent(db, f"run {i}", model=model, tools=[], metadata={}, max_attempts=3)
                for i in range(8)
            ]
            wait_until(
                lambda: all(run_row(db, r)["status"] in ("completed", "failed", "dead") for r in runs),
                60,
                "every run ended",
                interval=0.2,
            )
        statuses = [run_row(db, r)["status"] for r in runs]
        sent = [r.status for r in fake.requests]
    assert statuses == ["completed"] * len(runs)
    print(f"\n{len(runs)} runs, 2 requests every 2 s: {len(limit.refused)} refused")
    assert sent.count(200) == len(runs) and not limit.refused, f"{len(limit.refused)} refused: {sent}"
    assert blocks._value.get() > blocked_before  # blocked by the headers, not by luck
    row = db.execute(
        "SELECT blocks_reported, requests_per_minute FROM runrow.rate_limit WHERE rate_limit_key = %s",
        (model,),
    ).fetchone()
    assert row == (0, None)  # blocked from the headers alone: no 429 reported, no limit set


@pytest.fixture
def tool_loop_worker(module_db: str) -> Iterator[FakeModel]:
    registry = ToolRegistry()

    @tool(
        input_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
        description="Count.",
        effect="pure",
        into=registry,
    )
    def count(n: int, idempotency_key: str) -> str:
        return f"counted {n} " + "x" * 400

    def forever(request: ModelRequest) -> Any:
        return turn(Text(f"step {request.step}, again."), ToolCall("count", {"n": request.step}))

    with FakeModel(forever) as fake:
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "test-key", "registry": registry}
        with in_process_worker(module_db, "budget", config=config, lease_seconds=5, concurrency=1):
            yield fake


def test_a_token_budget_ends_the_run_after_the_crossing_step(
    module_conn: psycopg.Connection, tool_loop_worker: FakeModel
) -> None:
    db = module_conn
    fake = tool_loop_worker
    tools = [{"name": "count", "description": "Count.", "input_schema": {"type": "object"}}]
    run = db.execute(
        "SELECT run_id FROM runrow.enqueue_run(conversation_id => %s, content => '\"count forever\"', "
        "model => 'claude-fake-1', tools => %s::jsonb, token_budget => 2000)",
        (uuid.uuid4(), json.dumps(tools)),
    ).fetchone()[0]
    wait_until(
        lambda: run_row(db, run)["status"] != "queued" and run_row(db, run)["status"] != "running",
        30,
        "ended",
    )
    row = run_row(db, run)
    assert row["status"] == "failed"
    assert row["error"].startswith("budget_exhausted: the run used "), row["error"]
    assert row["result"]["text"].startswith("step ")
    usage = [
        u["input_tokens"] + u["output_tokens"]
        for (u,) in db.execute(
            "SELECT usage FROM runrow.agent_step WHERE run_id = %s AND kind = 'model_turn' ORDER BY seq",
            (run,),
        ).fetchall()
    ]
    assert sum(usage[:-1]) < 2000 <= sum(usage), usage  # the last step is the one that crossed
    time.sleep(0.5)  # a request sent after the ending would have arrived by now
    assert len(fake.requests) == len(usage), "a model request was sent after the budget was crossed"
    kinds = [kind for _, kind, _ in steps(db, run)]
    assert kinds[-1] in ("model_turn", "tool_result")
    journal = [
        t for (t,) in db.execute("SELECT type FROM runrow.run_event WHERE run_id = %s ORDER BY seq", (run,))
    ]
    assert journal[-2:] == ["budget_exhausted", "complete"]


@pytest.fixture
def plain_worker(module_db: str) -> Iterator[FakeModel]:
    with FakeModel("text") as fake:
        config = {
            "anthropic_base_url": fake.base_url,
            "anthropic_api_key": "test-key",
            "anthropic_max_retries": 0,
            "rate_limit_max_wait": 1.0,  # a longer wait defers the run
        }
        with in_process_worker(module_db, "backoff", config=config, lease_seconds=5, concurrency=1):
            yield fake


def requeued(db: psycopg.Connection, run: uuid.UUID) -> dict[str, Any]:
    row = db.execute(
        "SELECT payload, created_at FROM runrow.run_event WHERE run_id = %s AND type = 'run_requeued'", (run,)
    ).fetchone()
    assert row is not None
    return {"not_before": row[0]["not_before"], "at": row[1]}


def test_a_529_releases_the_run_with_the_apis_retry_after(
    module_conn: psycopg.Connection, plain_worker: FakeModel
) -> None:
    db = module_conn
    plain_worker.inject(overloaded(2.0))
    run = enqueue_agent(db, "hi", model="claude-backoff", tools=[], metadata={}, max_attempts=2)
    wait_until(lambda: run_row(db, run)["status"] == "completed", 30, "completed")
    event = requeued(db, run)
    delay = (datetime.fromisoformat(event["not_before"]) - event["at"]).total_seconds()
    assert 2.0 <= delay <= 2.2 + 0.1, delay  # retry-after, plus at most 10 % jitter
    assert run_row(db, run)["attempt"] == 2


def test_a_5xx_without_retry_after_backs_off_exponentially(
    module_conn: psycopg.Connection, plain_worker: FakeModel
) -> None:
    db = module_conn
    plain_worker.inject(server_error(None))
    run = enqueue_agent(db, "hi", model="claude-backoff", tools=[], metadata={}, max_attempts=2)
    wait_until(lambda: run_row(db, run)["status"] == "completed", 30, "completed")
    event = requeued(db, run)
    delay = (datetime.fromisoformat(event["not_before"]) - event["at"]).total_seconds()
    assert 0.5 <= delay <= 1.1, delay  # attempt 1: 1 s, half of it jitter


def test_a_429_is_reported_and_the_attempt_waits_it_out(
    module_conn: psycopg.Connection, plain_worker: FakeModel
) -> None:
    db = module_conn
    plain_worker.inject(rate_limited(0.5))
    run = enqueue_agent(db, "hi", model="claude-429", tools=[], metadata={}, max_attempts=1)
    wait_until(lambda: run_row(db, run)["status"] == "completed", 30, "completed")
    assert [r.status for r in plain_worker.requests] == [429, 200]  # no SDK retry, one more request
    row = db.execute(
        "SELECT blocks_reported, blocked_by_run FROM runrow.rate_limit WHERE rate_limit_key = 'claude-429'"
    ).fetchone()
    assert row == (1, run)
    assert run_row(db, run)["attempt"] == 1  # waited within the attempt


def test_a_wait_longer_than_the_worker_waits_defers_the_run_without_spending_its_attempt(
    module_conn: psycopg.Connection, plain_worker: FakeModel
) -> None:
    """A 429 whose retry-after (2 s) is past rate_limit_max_wait (1 s): the run is handed back
    until the block ends. release_run spent the attempt for it, so a run on its one attempt
    (max_attempts 1, the default) ended failed for having waited (the fleet-limits audit)."""
    db = module_conn
    plain_worker.inject(rate_limited(2.0))
    run = enqueue_agent(db, "hi", model="claude-429-long", tools=[], metadata={}, max_attempts=1)
    wait_until(lambda: run_row(db, run)["status"] == "completed", 30, "completed")
    assert [r.status for r in plain_worker.requests] == [429, 200]
    event = requeued(db, run)
    payload = db.execute(
        "SELECT payload FROM runrow.run_event WHERE run_id = %s AND type = 'run_requeued'", (run,)
    ).fetchone()
    assert payload is not None and payload[0]["deferred"] is True and payload[0]["attempt"] == 0
    delay = (datetime.fromisoformat(event["not_before"]) - event["at"]).total_seconds()
    assert 1.0 < delay <= 2.1, delay  # what was left of the 2 s block
    assert run_row(db, run)["attempt"] == 1  # claimed twice, one attempt spent


def test_the_sdk_does_not_retry_a_429_alone() -> None:
    async def go(fake: FakeModel) -> None:
        client = FleetClient(base_url=fake.base_url, api_key="k", max_retries=2)
        with pytest.raises(anthropic.RateLimitError):
            async with client.messages.stream(
                model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            ) as stream:
                await stream.get_final_message()

    with FakeModel("text") as fake:
        fake.inject(rate_limited(0.01), rate_limited(0.01))
        asyncio.run(go(fake))
        assert len(fake.requests) == 1  # the worker reports it; plain AsyncAnthropic would send 3


def test_a_response_cut_mid_stream_is_paid_for_and_counts_toward_the_tenant_budget(
    module_conn: psycopg.Connection, plain_worker: FakeModel
) -> None:
    """A stream that fails after its message_start was billed for its input: record_usage counts
    it, so the tenant's budget stops the retries. It was counted nowhere, and a tenant's
    runs could be billed once per attempt past their budget without end (the money audit: 9
    cut attempts billed 13,662 input tokens against a budget of 1,000, spend 0)."""
    db = module_conn
    db.execute("SELECT runrow.set_tenant_budget('cut-tenant', 1, NULL)")
    plain_worker.inject(*[error_event(after_events=2)] * 3)
    before = len(plain_worker.requests)
    run = db.execute(
        "SELECT run_id FROM runrow.enqueue_run(conversation_id => %s, content => '\"hi\"', "
        "model => 'claude-cut', max_attempts => 3, fairness_key => 'cut-tenant', "
        "metadata => '{\"max_tokens\": 64}')",
        (uuid.uuid4(),),
    ).fetchone()[0]
    wait_until(lambda: run_row(db, run)["status"] not in ("queued", "running"), 30, "ended")
    row = run_row(db, run)
    sent = plain_worker.requests[before:]
    billed = sent[0].response["usage"]["input_tokens"]
    assert billed > 0
    assert len(sent) == 1, [(r.status, r.outcome) for r in sent]  # not one per attempt
    assert row["status"] == "failed" and row["error"].startswith("budget_exhausted"), row["error"]
    spent = db.execute(
        "SELECT r.spent_tokens, s.input_tokens FROM runrow.agent_run AS r, runrow.spend_hour AS s "
        "WHERE r.id = %s AND s.fairness_key = 'cut-tenant'",
        (run,),
    ).fetchone()
    assert spent is not None and spent[1] == billed and spent[0] >= billed, (spent, billed)


def test_a_turn_with_empty_content_is_paid_for(module_conn: psycopg.Connection, module_db: str) -> None:
    """Nothing to store (the API refuses an empty assistant message), but the response was
    billed: its usage counts toward the run's spend (it counted nowhere)."""
    db = module_conn
    with FakeModel(lambda request: turn(stop_reason="end_turn")) as fake:
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "k", "anthropic_max_retries": 0}
        with in_process_worker(module_db, "empty", config=config, lease_seconds=5, concurrency=1):
            run = enqueue_agent(db, "hi", model="claude-empty", tools=[], metadata={}, max_attempts=1)
            wait_until(lambda: run_row(db, run)["status"] == "completed", 30, "completed")
        usage = fake.requests[0].response["usage"]
    billed = sum(usage[k] or 0 for k in ("input_tokens", "output_tokens"))
    assert billed > 0
    (spent,) = db.execute("SELECT spent_tokens FROM runrow.agent_run WHERE id = %s", (run,)).fetchone()
    assert spent == billed, (spent, usage)


def test_a_response_cut_by_a_drain_is_paid_for(module_conn: psycopg.Connection, module_db: str) -> None:
    """A drain past its budget cancels the run's task mid-stream, as a lost claim does: the
    stream is closed, and the input the response was billed for is paid for while the claim
    still holds the run. Only a stop or a failure paid for a cut stream, so each deploy's
    SIGTERM billed one response per run in flight that no spend or budget counted."""
    db = module_conn
    long_text = " ".join(f"word{i}" for i in range(300))
    with FakeModel(lambda request: turn(Text(long_text))) as fake:
        fake.inject(slow(0.05))  # ~15 s of stream unless it is cut
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "k", "anthropic_max_retries": 0}
        options = {"lease_seconds": 5, "concurrency": 1, "drain_seconds": 0.2}
        with in_process_worker(module_db, "drained", config=config, **options):
            run = enqueue_agent(db, "Talk.", model="claude-drained", tools=[], metadata={}, max_attempts=1)
            wait_until(lambda: streamed_text(db, run), 15, "text to stream")
        # Leaving the block drains the worker: 0.2 s, then the run is abandoned mid-stream.
        wait_until(lambda: fake.requests[-1].outcome == "client_closed", 10, "the stream to be closed")
        usage = fake.requests[-1].response["usage"]
    row = run_row(db, run)
    assert row["status"] == "failed" and row["error"].startswith("drained"), (row["status"], row["error"])
    assert len(streamed_text(db, run)) < len(long_text)  # cut mid-stream, not finished
    billed = usage["input_tokens"]
    (spent,) = db.execute("SELECT spent_tokens FROM runrow.agent_run WHERE id = %s", (run,)).fetchone()
    assert billed > 0 and spent >= billed, (spent, usage)


def test_a_response_stopped_mid_answer_is_paid_for_the_output_it_streamed(
    module_conn: psycopg.Connection, module_db: str
) -> None:
    """The API reports output_tokens at message_start (a token or so) and then only in the
    message_delta a long answer sends at its end: a run stopped mid-answer was charged about 1
    output token for all it had streamed, so a person stopping long answers spent almost
    nothing of a budget. A cut response now counts the larger of what was reported and the
    characters streamed at 3 a token."""
    db = module_conn
    long_text = " ".join(f"word{i}" for i in range(300))
    with FakeModel(lambda request: turn(Text(long_text))) as fake:
        fake.inject(slow(0.05))  # ~15 s of stream unless it is cut
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "k", "anthropic_max_retries": 0}
        with in_process_worker(module_db, "stopped", config=config, lease_seconds=5, concurrency=1):
            run = enqueue_agent(db, "Talk.", model="claude-stopped", tools=[], metadata={}, max_attempts=1)
            wait_until(lambda: len(streamed_text(db, run)) >= 300, 15, "300 characters to stream")
            db.execute("SELECT runrow.cancel_run(%s)", (run,))
            wait_until(lambda: run_row(db, run)["status"] == "cancelled", 15, "the stop")
        reported = fake.requests[-1].response["usage"]
    streamed = len(streamed_text(db, run))
    assert 300 <= streamed < len(long_text)
    (spent,) = db.execute("SELECT spent_tokens FROM runrow.agent_run WHERE id = %s", (run,)).fetchone()
    assert spent >= reported["input_tokens"] + streamed // 3, (spent, streamed, reported)


def test_web_searches_are_paid_for_at_their_price_per_request(
    module_conn: psycopg.Connection, module_db: str
) -> None:
    """The API bills web search per request on top of its tokens (10 USD per 1,000 searches) and
    reports the count in usage.server_tool_use. Costs were settled from tokens alone, so a turn
    that ran 50 searches was billed 0.50 USD more than its run, its tenant's day and their cost
    budgets counted (the audit: 50 searches, spent_cost 0.000225). The real SDK's usage carries
    the count to append_step, priced at set_model_price's documented default."""
    db = module_conn
    db.execute("SELECT runrow.set_model_price('claude-searching', 3, 15, 3.75, 0.3)")
    db.execute("SELECT runrow.set_tenant_budget('search-tenant', NULL, 0.4)")
    searches = {"web_search_requests": 50, "web_fetch_requests": 2}
    with FakeModel(lambda request: turn(Text("found it"), server_tool_use=searches)) as fake:
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "k", "anthropic_max_retries": 0}
        with in_process_worker(module_db, "searching", config=config, lease_seconds=5, concurrency=1):
            runs = []
            for _ in range(2):  # one after the other: the second finds the tenant's day spent
                runs.append(
                    db.execute(
                        "SELECT run_id FROM runrow.enqueue_run(conversation_id => %s, "
                        "content => '\"search\"', model => 'claude-searching', max_attempts => 1, "
                        "fairness_key => 'search-tenant', cost_budget => 0.1)",
                        (uuid.uuid4(),),
                    ).fetchone()[0]
                )
                wait_until(lambda: run_row(db, runs[-1])["status"] not in ("queued", "running"), 30, "ended")
        usage = fake.requests[0].response["usage"]
    assert usage["server_tool_use"] == searches
    prices = {"input_tokens": 3, "output_tokens": 15, "cache_creation_input_tokens": 3.75}
    tokens = sum(Decimal(str(p)) * (usage.get(k) or 0) for k, p in prices.items()) / 1_000_000
    first = run_row(db, runs[0])
    # The turn ran its searches and was stored (the step that crosses a budget is kept), so the
    # run completed; the second run of the tenant gets no request: its day is spent.
    assert first["status"] == "completed", first["error"]
    (spent, stored) = db.execute(
        "SELECT r.spent_cost, s.usage -> 'server_tool_use' FROM runrow.agent_run AS r "
        "JOIN runrow.agent_step AS s ON s.run_id = r.id AND s.kind = 'model_turn' WHERE r.id = %s",
        (runs[0],),
    ).fetchone()
    assert stored == searches
    assert spent == tokens + Decimal("0.50"), (spent, usage)  # 50 x 0.01, the fetches at 0
    (day,) = db.execute(
        "SELECT sum(cost) FROM runrow.spend_hour WHERE fairness_key = 'search-tenant'"
    ).fetchone()
    assert day == spent
    second = run_row(db, runs[1])
    assert second["status"] == "failed", second["error"]
    assert 'tenant "search-tenant" spent' in second["error"], second["error"]
    assert len(fake.requests) == 1
