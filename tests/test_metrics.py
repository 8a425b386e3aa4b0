"""Prometheus metrics (issue 15, part 1): scrape `runrow worker --metrics-port 0` and `runrow serve`
as real processes before and after real runs (echo handler; the agent loop against the fake
Messages API with a 429 and a 529 the SDK retries) and check the values move as the runs did."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psycopg
from agent_support import agent_worker, enqueue_agent
from metrics_support import Samples, metrics_url, scrape, total, value
from worker_support import (
    REPO,
    db,
    enqueue_echo,
    start_worker,
    wait_status,
    wait_until,
    worker_db,
    worker_with_test_handler,
)

from pyworker.fake.faults import overloaded, rate_limited
from pyworker.fake.server import FakeModel

__all__ = ["db", "start_worker", "worker_db"]


def test_worker_metrics_move_with_echo_runs(db: psycopg.Connection, start_worker) -> None:  # type: ignore[no-untyped-def]
    worker = start_worker("metrics-echo", "--metrics-port", "0", "--concurrency", "1", "--poll", "0.3")
    url = metrics_url(worker)
    before = scrape(url)
    assert value(before, "runrow_db_up") == 1
    assert value(before, "runrow_hub_up") == 1
    assert value(before, "runrow_claims_total") == 0
    assert value(before, "runrow_queue_depth", status="queued") == 0

    # One slot: the first run holds it for 3 s, so the second is seen waiting in the queue (by a
    # scrape past the CACHE_SECONDS that reuse the first one's row).
    slow = enqueue_echo(db, "slow one", duration=3.0)
    wait_status(db, slow, "running")
    queued = enqueue_echo(db, "queued one", duration=0.1)
    during = wait_until(
        lambda: (
            (s := scrape(url))
            and value(s, "runrow_queue_depth", status="running") == 1
            and value(s, "runrow_queue_depth", status="queued") == 1
            and s
        ),
        2,
        "one run running and one queued",
    )
    assert value(during, "runrow_oldest_queued_age_seconds") >= 0
    for run in (slow, queued, enqueue_echo(db, "third", duration=0.1)):
        assert wait_status(db, run, {"completed", "failed", "dead"}) == "completed"

    after = wait_until(
        lambda: (
            (s := scrape(url))
            and value(s, "runrow_attempt_duration_seconds_count", ending="completed") == 3
            and s
        ),
        10,
        "three completed attempts in the histogram",
    )
    assert value(after, "runrow_claims_total") == 3
    assert value(after, "runrow_enqueue_to_claim_seconds_count") == 3
    # The queued run waited behind the 2 s run: its wait is in a bucket above 0.5 s.
    assert value(after, "runrow_enqueue_to_claim_seconds_bucket", le="0.5") < 3
    assert value(after, "runrow_journal_flush_events_count") > value(
        before, "runrow_journal_flush_events_count"
    )
    assert value(after, "runrow_journal_flush_events_sum") > 0
    assert value(after, "runrow_queue_depth", status="queued") == 0
    assert value(after, "runrow_queue_depth", status="running") == 0
    assert not [key for key in after if any(k == "run_id" for k, _ in key[1])]  # labels are bounded


def test_schedule_gauges_follow_a_tick_a_session_holds_back(db: psycopg.Connection, start_worker) -> None:  # type: ignore[no-untyped-def]
    """queue_metrics' schedule columns (migration 0079) as a worker exports them: a tick due since
    1 January whose conversation another session holds stays due through the worker's reaper
    passes, and is counted overdue, aged and erroring until the session lets go and it fires."""
    conversation = uuid.uuid4()
    (schedule,) = db.execute(
        "SELECT runrow.create_schedule('held-back', '0 0 1 1 *', '\"tick\"', 'echo', conversation_id => %s)",
        (conversation,),
    ).fetchone()
    db.execute(
        "UPDATE runrow.schedule"
        " SET next_fire_at = date_trunc('year', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' WHERE id = %s",
        (schedule,),
    )
    (late,) = db.execute("SELECT extract(EPOCH FROM now() - next_fire_at) FROM runrow.schedule").fetchone()
    holder = psycopg.connect(db.info.dsn)  # a client enqueueing into the conversation, uncommitted
    try:
        holder.execute("SELECT runrow.enqueue_run(%s, '\"a user turn\"', 'echo')", (conversation,))
        worker = start_worker("metrics-schedules", "--metrics-port", "0", "--reap-interval", "0.2")
        url = metrics_url(worker)
        held = wait_until(
            lambda: (s := scrape(url)) and value(s, "runrow_schedules_with_last_error") == 1 and s,
            10,
            "a reaper pass to leave the tick due, busy",
        )
        assert value(held, "runrow_schedules_overdue") == (1 if late > 300 else 0)
        assert value(held, "runrow_oldest_due_tick_age_seconds") >= late
    finally:
        holder.rollback()
        holder.close()
    fired = wait_until(
        lambda: (
            (s := scrape(url))
            and value(s, "runrow_schedules_with_last_error") == 0
            and value(s, "runrow_oldest_due_tick_age_seconds") == 0
            and s
        ),
        10,
        "a reaper pass to fire the tick once the session let go",
    )
    assert value(fired, "runrow_schedules_overdue") == 0
    assert db.execute("SELECT last_run_id IS NOT NULL FROM runrow.schedule").fetchone() == (True,)


def test_blocked_gauges_count_a_turn_behind_a_start_in_turn(db: psycopg.Connection, start_worker) -> None:  # type: ignore[no-untyped-def]
    """queue_metrics' queued_blocked and oldest_blocked_age_seconds (migration 0090) as a worker
    exports them: a turn behind its conversation's start_in turn (due in a year) was in
    runrow_queue_depth{status="queued"} only, in neither runrow_queued_claimable nor
    runrow_queued_not_due (the audit's case)."""
    conversation = uuid.uuid4()
    db.execute(
        "SELECT runrow.enqueue_run(%s, '\"next year\"', 'echo', start_in => '366 days')", (conversation,)
    )
    enqueue_echo(db, "behind it", conversation_id=conversation)
    worker = start_worker("metrics-blocked", "--metrics-port", "0", "--poll", "0.3")
    url = metrics_url(worker)
    held = wait_until(
        lambda: (s := scrape(url)) and value(s, "runrow_queued_blocked") == 1 and s,
        10,
        "a claim to find the second turn behind the first",
    )
    assert value(held, "runrow_queue_depth", status="queued") == 2
    assert value(held, "runrow_queued_not_due") == 1
    assert value(held, "runrow_queued_claimable") == 0
    assert value(held, "runrow_oldest_blocked_age_seconds") >= 0
    assert "# HELP runrow_queued_blocked Queued runs due but held" in httpx.get(url, timeout=10).text


def test_agent_run_counts_model_requests_tokens_throttling_and_tools(
    db: psycopg.Connection, worker_db: str, tmp_path: Path
) -> None:
    # A priced model is labelled by its name (any other counts as "other").
    db.execute("SELECT runrow.set_model_price('claude-fake-1', 3, 15, 3.75, 0.3)")
    # The first request meets a 429, its retry a 529; the SDK's third try goes through.
    with FakeModel("demo", faults=[rate_limited(), overloaded()]) as fake:
        worker = agent_worker(worker_db, "metrics-agent", fake.base_url, tmp_path, "--metrics-port", "0")
        try:
            worker.wait_started(20)
            url = metrics_url(worker)
            run = enqueue_agent(db)
            assert wait_status(db, run, {"completed", "failed", "dead"}, 60) == "completed", worker.log()
            samples = wait_until(
                lambda: (
                    (s := scrape(url))
                    and value(s, "runrow_attempt_duration_seconds_count", ending="completed")
                    and s
                ),
                10,
                "the attempt in the histogram",
            )
        finally:
            worker.close()
    model = "claude-fake-1"
    assert value(samples, "runrow_model_request_seconds_count", model=model, outcome="ok") == 6
    assert value(samples, "runrow_model_throttled_responses_total", status="429") == 1
    assert value(samples, "runrow_model_throttled_responses_total", status="529") == 1
    for kind in ("input", "output"):
        assert value(samples, "runrow_model_tokens_total", model=model, kind=kind) > 0
    # The demo task: list_files, read_file x3, send_email, write_file, every one ran and succeeded.
    assert total(samples, "runrow_tool_calls_total", outcome="ok") == 6
    assert value(samples, "runrow_tool_calls_total", effect="pure", outcome="ok") == 4  # list, read x3
    assert total(samples, "runrow_tool_calls_total", outcome="error") == 0


def test_serve_metrics(worker_db: str, tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *[sys.executable, "-m", "pyworker", "serve", "--insecure-dev", "--port", str(port)],
                *["--max-streams-per-user", "1"],
            ],
            cwd=REPO,
            env={**os.environ, "DATABASE_URL": worker_db},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _up(base) or proc.poll() is not None, 30, "runrow serve to answer")
        assert proc.poll() is None, log.read_text()
        before = scrape(f"{base}/metrics")
        assert value(before, "runrow_db_up") == 1
        assert value(before, "runrow_hub_up") == 1
        queued_before = value(before, "runrow_queue_depth", status="queued")
        for _ in range(2):  # nobody works: they stay queued
            response = httpx.post(
                f"{base}/conversations/{uuid.uuid4()}/runs", json={"content": "hi"}, timeout=10
            )
            assert response.status_code == 202, response.text
        # A scrape within CACHE_SECONDS of the first shares its row: wait for a fresh one.
        after = wait_until(
            lambda: (
                (s := scrape(f"{base}/metrics"))
                and value(s, "runrow_queue_depth", status="queued") == queued_before + 2
                and s
            ),
            3,
            "the two runs queued",
        )
        assert value(after, "runrow_oldest_queued_age_seconds") >= 0
        assert "process_cpu_seconds_total" in {name for name, _ in after}  # the process's own are there
        _http_series(base, after)
    finally:
        proc.terminate()
        proc.wait(15)


def _http_series(base: str, samples: Samples) -> None:
    """The service's own series, by route template; none of the worker's, which a serve process
    exported stuck at 0 (the serve audit: claims, runs in flight, the key gauge, flushes)."""
    names = {name for name, _ in samples}
    assert not {"runrow_claims_total", "runrow_runs_in_flight", "runrow_model_key_broken"} & names
    assert not [name for name in names if name.startswith(("runrow_journal_flush", "runrow_model_"))]
    enqueue = "/conversations/{conversation_id}/runs"
    assert value(samples, "runrow_http_requests_total", route=enqueue, status="202") == 2
    assert value(samples, "runrow_http_request_duration_seconds_count", route=enqueue) == 2
    assert value(samples, "runrow_http_requests_total", route="/metrics", status="200") >= 1
    routes = {dict(labels)["route"] for name, labels in samples if name == "runrow_http_requests_total"}
    assert not [route for route in routes if "-" in route], routes  # never a path with an id in it
    run = httpx.post(f"{base}/conversations/{uuid.uuid4()}/runs", json={"content": "hi"}, timeout=10)
    with httpx.stream("GET", f"{base}/runs/{run.json()['run_id']}/events", timeout=10) as stream:
        lines = stream.iter_lines()  # held: a dropped iterator closes the response
        assert next(lines).startswith("retry:")
        # A second stream of the same user is past --max-streams-per-user 1: a 429, counted.
        refused = httpx.get(f"{base}/runs/{run.json()['run_id']}/events", timeout=10)
        assert refused.status_code == 429, refused.text
        during = scrape(f"{base}/metrics")
    assert value(during, "runrow_http_streams_open") == 1
    assert value(during, "runrow_http_streams_refused_total") == 1
    assert value(during, "runrow_http_requests_total", route="/runs/{run_id}/events", status="429") == 1
    assert httpx.get(f"{base}/nowhere/{uuid.uuid4()}", timeout=10).status_code == 404
    after = wait_until(
        lambda: (s := scrape(f"{base}/metrics")) and value(s, "runrow_http_streams_open") == 0 and s,
        10,
        "the stream to close",
    )
    assert value(after, "runrow_http_requests_total", route="unmatched", status="404") == 1


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/metrics", timeout=2).status_code == 200
    except httpx.HTTPError:
        time.sleep(0.2)
        return False


async def test_a_scrape_the_database_does_not_answer_says_why(caplog) -> None:  # type: ignore[no-untyped-def]
    """A scrape that timed out logged "the database query failed: " and nothing after it: a
    TimeoutError has no text. runrow_db_up goes to 0 and the db gauges are left out."""
    import asyncio
    import contextlib
    import logging

    from prometheus_client.parser import text_string_to_metric_families

    from pyworker.worker import metrics

    class NeverAnswers:
        @contextlib.asynccontextmanager
        async def connection(self):  # type: ignore[no-untyped-def]
            await asyncio.sleep(3600)
            yield None

    with caplog.at_level(logging.WARNING, logger="runrow.metrics"):
        text = (await metrics.scrape(NeverAnswers(), timeout=0.05)).decode()
    assert "metrics scrape: the database query failed: no answer within 0.05 s" in caplog.text
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["runrow_db_up"] == 0 and "runrow_oldest_queued_age_seconds" not in samples


def test_a_scrape_answers_while_handlers_hold_every_connection_of_the_run_pool(
    db: psycopg.Connection, worker_db: str
) -> None:
    """The metrics audit: the scrape borrowed a connection from the run pool, so with handlers
    holding all of it (a pool at --concurrency, as the README asks of handlers using ctx.db) it
    waited out its 5 s and said runrow_db_up 0 with no database gauges: a false "database down"
    exactly when the worker was busiest. The scrapes have a connection of their own now; and the
    worker says how full it is (runrow_runs_in_flight against runrow_concurrency)."""
    worker = worker_with_test_handler(
        worker_db,
        "metrics-held",
        ["--pool-size", "1", "--concurrency", "1", "--metrics-port", "0", "--poll", "0.3"],
        "hold_handler:handle",
    )
    try:
        worker.wait_started()
        url = metrics_url(worker)
        run = enqueue_echo(db, "held")
        wait_status(db, run, "running")
        # The handler's pg_sleep holds the pool's one connection.
        wait_until(
            lambda: (
                db.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND query LIKE 'SELECT pg_sleep%%' AND state = 'active'"
                ).fetchone()
                == (1,)
            ),
            10,
            "the handler to hold its connection",
        )
        started = time.monotonic()
        samples = scrape(url)
        took = time.monotonic() - started
    finally:
        worker.close()
    assert took < 2.0, took  # was 5.0 s, the scrape's whole wait for a connection
    assert value(samples, "runrow_db_up") == 1
    assert value(samples, "runrow_queue_depth", status="running") == 1
    assert value(samples, "runrow_runs_in_flight") == 1
    assert value(samples, "runrow_concurrency") == 1


async def test_concurrent_scrapes_share_one_query() -> None:
    """Every scrape ran its own query: a scrape storm (several Prometheus replicas, dashboards
    scraping directly) was that many queries. Scrapes in flight together, and those within
    CACHE_SECONDS of an answer, share it."""
    import asyncio
    import contextlib

    from pyworker.worker import metrics

    queries = 0

    class Cursor:
        description = (type("Column", (), {"name": "queued"})(),)

        async def fetchone(self) -> tuple[int]:
            return (7,)

    class Conn:
        async def execute(self, sql: str) -> Cursor:
            nonlocal queries
            queries += 1
            await asyncio.sleep(0.05)  # the query takes a while: the scrapes pile up behind it
            return Cursor()

    class Pool:
        @contextlib.asynccontextmanager
        async def connection(self):  # type: ignore[no-untyped-def]
            yield Conn()

    pool = Pool()
    texts = await asyncio.gather(*(metrics.scrape(pool) for _ in range(20)))
    assert queries == 1
    assert all(b'runrow_queue_depth{status="queued"} 7.0' in text for text in texts)
    await metrics.scrape(pool)  # within CACHE_SECONDS: the same answer
    assert queries == 1
    await asyncio.sleep(metrics.CACHE_SECONDS)
    await metrics.scrape(pool)
    assert queries == 2


def test_only_a_priced_model_gets_a_label_of_its_own(
    db: psycopg.Connection, worker_db: str, tmp_path: Path
) -> None:
    """The metrics audit: the first 50 distinct model strings a process saw got a label each, and
    an enqueuer chooses the string: 50 junk names pushed the real model into "other" for the life
    of the process. A model gets its label when the operator priced it (runrow.model_prices)."""
    db.execute("SELECT runrow.set_model_price('claude-priced', 3, 15, 3.75, 0.3)")
    with FakeModel("text") as fake:
        worker = agent_worker(
            worker_db, "metrics-models", fake.base_url, tmp_path, "--metrics-port", "0", "--concurrency", "8"
        )
        try:
            worker.wait_started(20)
            url = metrics_url(worker)
            junk = [
                enqueue_agent(db, "hi", model=f"junk-{i}", tools=[], metadata={}, system=None)
                for i in range(50)
            ]
            for run in junk:
                assert wait_status(db, run, {"completed", "failed", "dead"}, 60) == "completed", worker.log()
            priced = enqueue_agent(db, "hi", model="claude-priced", tools=[], metadata={}, system=None)
            assert wait_status(db, priced, {"completed", "failed", "dead"}, 60) == "completed", worker.log()
            samples = wait_until(
                lambda: (
                    (s := scrape(url))
                    and value(s, "runrow_attempt_duration_seconds_count", ending="completed") == 51
                    and s
                ),
                10,
                "51 attempts in the histogram",
            )
        finally:
            worker.close()
    assert value(samples, "runrow_model_request_seconds_count", model="claude-priced", outcome="ok") == 1
    assert value(samples, "runrow_model_request_seconds_count", model="other", outcome="ok") == 50
    assert value(samples, "runrow_model_tokens_total", model="claude-priced", kind="output") > 0
    models = {dict(labels).get("model") for name, labels in samples if name.startswith("runrow_model_")}
    assert models - {None} == {"claude-priced", "other"}
