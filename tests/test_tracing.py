"""OpenTelemetry traces (issue 15, part 2), read with the SDK's InMemorySpanExporter: one trace per
run, an attempt span with the model requests and tool calls under it, the caller's traceparent
continued (also by the worker that resumes a run killed with SIGKILL), the traceparent header of
the HTTP API, and a worker without the `otel` extra."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from agent_support import TOOLS, InProcessWorker, agent_worker, enqueue_agent, steps
from http_support import ALICE, serve
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from trace_support import spans, untraced
from worker_support import REPO, db, run_row, wait_status, wait_until, worker_db

from pyworker.fake.server import FakeModel

__all__ = ["db", "spans", "untraced", "worker_db"]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
DEMO_TOOLS = ["list_files", "read_file", "read_file", "send_email", "write_file", "read_file"]


def agent_config(fake: FakeModel) -> dict[str, Any]:
    return {"anthropic_base_url": fake.base_url, "anthropic_api_key": "test-key", "tools_module": TOOLS}


def of_run(exporter: InMemorySpanExporter, run_id: uuid.UUID) -> list[ReadableSpan]:
    """The attempt spans of the run and every span under them."""
    spans = list(exporter.get_finished_spans())
    attempts = {s.context.span_id for s in spans if (s.attributes or {}).get("runrow.run_id") == str(run_id)}
    return [s for s in spans if s.context.span_id in attempts or (s.parent and s.parent.span_id in attempts)]


def test_one_trace_per_run_attempt_model_requests_and_tool_calls(
    db: psycopg.Connection, worker_db: str, tmp_path: Path, spans: InMemorySpanExporter, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RUNROW_DEMO_DIR", str(tmp_path))
    with FakeModel("demo") as fake, InProcessWorker(worker_db, "traced", config=agent_config(fake)):
        run = enqueue_agent(db, metadata={"max_tokens": 4096, "traceparent": TRACEPARENT})
        assert wait_status(db, run, {"completed", "failed", "dead"}, 60) == "completed"
        tree = wait_until(
            lambda: [s for s in of_run(spans, run) if s.name == "runrow.attempt"] and of_run(spans, run),
            10,
            "the attempt span",
        )
    (attempt,) = [s for s in tree if s.name == "runrow.attempt"]
    # The caller's trace, as a child of the caller's span.
    assert format(attempt.context.trace_id, "032x") == TRACE_ID
    assert attempt.parent is not None and format(attempt.parent.span_id, "016x") == PARENT_ID
    assert attempt.attributes["runrow.attempt"] == 1
    assert attempt.attributes["runrow.ending"] == "completed"
    assert {s.context.trace_id for s in tree} == {attempt.context.trace_id}  # one trace
    children = sorted((s for s in tree if s is not attempt), key=lambda s: s.start_time or 0)
    assert all(s.parent is not None and s.parent.span_id == attempt.context.span_id for s in children)

    requests = [s for s in children if s.name.startswith("chat ")]
    assert len(requests) == 6  # the demo's six model turns
    for request in requests:
        attrs = request.attributes or {}
        assert attrs["gen_ai.request.model"] == "claude-fake-1"
        assert attrs["gen_ai.usage.input_tokens"] > 0 and attrs["gen_ai.usage.output_tokens"] > 0
        assert attrs["anthropic.request_id"]
    stops = [request.attributes["gen_ai.response.finish_reasons"] for request in requests]
    assert list(stops[-1]) == ["end_turn"] and all(list(s) == ["tool_use"] for s in stops[:-1])
    # The model's request ids are the ones the step log recorded.
    recorded = {
        r
        for (r,) in db.execute(
            "SELECT request_id FROM runrow.agent_step WHERE run_id = %s AND kind = 'model_turn'", (run,)
        )
    }
    assert {request.attributes["anthropic.request_id"] for request in requests} == recorded

    tools = [s for s in children if s.name.startswith("execute_tool ")]
    assert [s.attributes["gen_ai.tool.name"] for s in tools] == DEMO_TOOLS
    assert {s.attributes["runrow.tool.state"] for s in tools} == {"execute"}
    assert {s.attributes["runrow.tool.outcome"] for s in tools} == {"ok"}
    assert tools[3].attributes["runrow.tool.effect"] == "non_idempotent"
    # Model requests and tool calls in the order the loop made them (step 2 asked for two reads).
    kinds = [s.name.split()[0] for s in children]
    assert kinds == ["chat", "execute_tool", "chat", "execute_tool", "execute_tool"] + [
        "chat",
        "execute_tool",
    ] * 3 + ["chat"]


def test_without_a_traceparent_the_run_id_is_the_trace_id(
    db: psycopg.Connection, worker_db: str, tmp_path: Path, spans: InMemorySpanExporter, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RUNROW_DEMO_DIR", str(tmp_path))
    with FakeModel("text") as fake, InProcessWorker(worker_db, "untraced", config=agent_config(fake)):
        run = enqueue_agent(db, content="Say hello.", tools=[], metadata={})
        assert wait_status(db, run, {"completed", "failed", "dead"}, 60) == "completed"
        tree = wait_until(lambda: of_run(spans, run), 10, "the run's spans")
    assert {s.context.trace_id for s in tree} == {run.int}
    assert sorted(s.name for s in tree) == ["chat claude-fake-1", "runrow.attempt"]


def test_a_fleet_limit_deferral_is_its_own_ending_and_not_an_error(
    db: psycopg.Connection, worker_db: str, spans: InMemorySpanExporter
) -> None:
    """A 429 whose retry-after (2 s) is past rate_limit_max_wait (1 s): the run is deferred, its
    attempt given back. That attempt was labelled `released:deferred` and its span marked ERROR,
    though waiting for the fleet is not the run failing (the metrics audit): an error-rate alert
    fired for every rate-limited run. Its ending is `deferred`, its span's status left unset."""
    from opentelemetry.trace import StatusCode
    from prometheus_client import REGISTRY

    from pyworker.fake.faults import rate_limited

    def deferred() -> float:
        labels = {"ending": "deferred"}
        return REGISTRY.get_sample_value("runrow_attempt_duration_seconds_count", labels) or 0.0

    before = deferred()
    with FakeModel("text") as fake:
        fake.inject(rate_limited(2.0))
        config = {**agent_config(fake), "anthropic_max_retries": 0, "rate_limit_max_wait": 1.0}
        with InProcessWorker(worker_db, "deferring", config=config, concurrency=1):
            run = enqueue_agent(db, "hi", model="claude-429-long", tools=[], metadata={}, max_attempts=1)
            assert wait_status(db, run, {"completed", "failed", "dead"}, 30) == "completed"
            attempts = wait_until(
                lambda: (
                    (a := [s for s in of_run(spans, run) if s.name == "runrow.attempt"]) and len(a) == 2 and a
                ),
                10,
                "both attempt spans",
            )
    first, second = sorted(attempts, key=lambda s: s.start_time or 0)
    assert first.attributes is not None and first.attributes["runrow.ending"] == "deferred"
    assert first.status.status_code == StatusCode.UNSET
    assert second.attributes is not None and second.attributes["runrow.ending"] == "completed"
    assert deferred() - before == 1
    assert run_row(db, run)["attempt"] == 1  # the deferral gave its attempt back


def test_a_run_killed_and_resumed_by_another_worker_stays_in_the_callers_trace(
    db: psycopg.Connection, worker_db: str, tmp_path: Path, spans: InMemorySpanExporter, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RUNROW_DEMO_DIR", str(tmp_path))
    flags = ("--lease", "1", "--grace", "0", "--reap-interval", "0.3", "--poll", "0.3", "--concurrency", "1")
    with FakeModel("demo") as fake:
        a = agent_worker(worker_db, "trace-a", fake.base_url, tmp_path, *flags, tool_delay="0.3")
        try:
            a.wait_started(20)
            run = enqueue_agent(db, metadata={"max_tokens": 4096, "traceparent": TRACEPARENT})
            wait_until(lambda: len(steps(db, run)) >= 3, 60, "step 3 to be committed")
            a.kill()  # SIGKILL: worker a writes nothing more
        finally:
            a.close()
        assert run_row(db, run)["status"] == "running"
        with InProcessWorker(
            worker_db,
            "trace-b",
            config=agent_config(fake),
            lease_seconds=1,
            grace_seconds=0,
            reap_interval=0.3,
        ):
            assert wait_status(db, run, {"completed", "failed", "dead"}, 60) == "completed"
            tree = wait_until(
                lambda: [s for s in of_run(spans, run) if s.name == "runrow.attempt"] and of_run(spans, run),
                10,
                "b's attempt",
            )
    assert run_row(db, run)["attempt"] == 2
    (attempt,) = [s for s in tree if s.name == "runrow.attempt"]
    assert attempt.attributes["runrow.attempt"] == 2
    assert attempt.attributes["runrow.worker_id"] == "trace-b"
    assert format(attempt.parent.span_id, "016x") == PARENT_ID  # type: ignore[union-attr]
    assert {format(s.context.trace_id, "032x") for s in tree} == {TRACE_ID}
    assert any(s.name.startswith("chat ") for s in tree) and any(
        s.name.startswith("execute_tool ") for s in tree
    )


def test_the_traceparent_header_is_stored_on_the_run(worker_db: str, untraced: InMemorySpanExporter) -> None:
    """With tracing off, as sent (tests/test_tracing_http.py has it with tracing on)."""
    with contextlib.contextmanager(serve)(worker_db) as server:
        base, conversation = server.url, uuid.uuid4()
        url = f"{base}/conversations/{conversation}/runs"
        ok = httpx.post(
            url, json={"content": "hi"}, headers={**ALICE, "traceparent": TRACEPARENT}, timeout=10
        )
        assert ok.status_code == 202, ok.text
        with psycopg.connect(worker_db) as conn:
            row = conn.execute(
                "SELECT metadata->>'traceparent' FROM runrow.agent_run WHERE id = %s", (ok.json()["run_id"],)
            ).fetchone()
        assert row == (TRACEPARENT,)
        # W3C Trace Context: a header that does not parse is ignored (the run's trace is then its
        # own), never a reason to refuse the run, as it was (a 400); a later version is read from
        # its first 55 characters.
        later = f"01-{TRACE_ID}-{PARENT_ID}-01-what-version-01-adds"
        for sent, stored in [
            ("00-xyz-00f067aa0ba902b7-01", None),
            (TRACEPARENT.upper(), None),
            (f"00-{'0' * 32}-{PARENT_ID}-01", None),
            (f"{TRACEPARENT}-extra", None),
            (later, later[:55]),
        ]:
            taken = httpx.post(
                f"{base}/conversations/{uuid.uuid4()}/runs",
                json={"content": "hi"},
                headers={**ALICE, "traceparent": sent},
                timeout=10,
            )
            assert taken.status_code == 202, taken.text
            with psycopg.connect(worker_db) as conn:
                row = conn.execute(
                    "SELECT metadata->>'traceparent' FROM runrow.agent_run WHERE id = %s",
                    (taken.json()["run_id"],),
                ).fetchone()
            assert row == (stored,), sent
        differ = httpx.post(
            f"{base}/conversations/{uuid.uuid4()}/runs",
            json={"content": "hi", "metadata": {"traceparent": f"00-{TRACE_ID}-{'1' * 16}-01"}},
            headers={**ALICE, "traceparent": TRACEPARENT},
            timeout=10,
        )
        assert differ.status_code == 400 and "differ" in differ.json()["error"]["message"]
        # Over SQL metadata a bad one is the 400 of enqueue_run's 22023, naming metadata.traceparent.
        sql = httpx.post(
            f"{base}/conversations/{uuid.uuid4()}/runs",
            json={"content": "hi", "metadata": {"traceparent": "nope"}},
            headers=ALICE,
            timeout=10,
        )
        assert sql.status_code == 400 and "metadata.traceparent" in sql.json()["error"]["message"]
    assert untraced.get_finished_spans() == ()  # no server span, nor any other


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter (its own tracer provider and metrics) with only `env` set."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **env},
    )


def test_without_the_otel_extra_the_hooks_do_nothing_and_still_count() -> None:
    code = textwrap.dedent(
        """
        import sys, uuid, datetime
        sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
        from pyworker.db.api import ClaimedRun
        from pyworker.worker import metrics, tracing
        assert not tracing.ENABLED
        run = ClaimedRun(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), 1, 1, "m", "p", None, [], None,
                         uuid.uuid4(), {"traceparent": "TRACEPARENT"}, datetime.datetime.now())
        with tracing.attempt(run, "w") as span:
            assert span is None
            tracing.attempt_ended(span, "completed")
        with tracing.model_request("m") as span:
            tracing.model_turn(span, "m", {"input_tokens": 1}, "req", "end_turn")
        with tracing.tool_call("t", "pure") as call:
            call.state = "execute"
        assert metrics.TOOL_CALLS.labels("pure", "ok")._value.get() == 1
        tracing.configure_from_env()
        from pyworker.http.app import create_app
        from pyworker.http.config import ServeConfig
        app = create_app(ServeConfig(database_url="postgresql:///nowhere", model="m", insecure_dev=True))
        assert type(app.build_middleware_stack()).__name__ == "SecurityHeaders"  # no ServerSpans
        print("untraced ok")
        """
    ).replace("TRACEPARENT", TRACEPARENT)
    done = _python(code, OTEL_TRACES_EXPORTER="console")
    assert done.returncode == 0, done.stderr
    assert "untraced ok" in done.stdout
    assert "the otel extra is not installed" in done.stderr


def test_without_a_tracer_provider_no_span_is_made_until_one_is_installed() -> None:
    """The otel API installed but no provider (an untraced worker): an attempt makes no span, not
    even the default proxy's non-recording one (its attributes, parent context and context switch
    were CPU per run); a provider installed later, by a handler or the application, is used."""
    code = textwrap.dedent(
        """
        import sys, uuid, datetime
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from pyworker.db.api import ClaimedRun
        from pyworker.worker import metrics, tracing
        assert tracing.ENABLED
        run = ClaimedRun(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), 1, 1, "m", "p", None, [], None,
                         uuid.uuid4(), {"traceparent": "TRACEPARENT"}, datetime.datetime.now())
        made = []
        tracing._parent = lambda run, real=tracing._parent: made.append(run) or real(run)
        with tracing.attempt(run, "w") as span:
            assert span is None, span
            assert trace.get_current_span() is trace.INVALID_SPAN
            tracing.attempt_ended(span, "completed")
            with tracing.model_request("m") as request:
                assert request is None, request
            with tracing.tool_call("t", "pure") as call:
                call.state = "execute"
        assert made == [], "a parent context was built for a span nobody records"
        assert metrics.TOOL_CALLS.labels("pure", "ok")._value.get() == 1
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        with tracing.attempt(run, "w") as span:
            with tracing.tool_call("t", "pure"):
                pass
            tracing.attempt_ended(span, "completed")
        names = sorted(s.name for s in exporter.get_finished_spans())
        assert names == ["execute_tool t", "runrow.attempt"], names
        print("lazy ok")
        """
    ).replace("TRACEPARENT", TRACEPARENT)
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert "lazy ok" in done.stdout


@pytest.mark.parametrize(("ratio", "recorded"), [(0.0, 0), (1.0, 20)])
def test_a_run_without_a_traceparent_follows_the_samplers_ratio(
    monkeypatch: pytest.MonkeyPatch, ratio: float, recorded: int
) -> None:
    """The stand-in parent made from the run id was always marked sampled, so a parent-based
    sampler recorded every run enqueued without a traceparent: OTEL_TRACES_SAMPLER_ARG was
    ignored for them (all 200 of 200 at a ratio of 0)."""
    from datetime import UTC, datetime

    from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio

    from pyworker.db.api import ClaimedRun
    from pyworker.worker import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBasedTraceIdRatio(ratio))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing.trace, "get_tracer_provider", lambda: provider)
    for _ in range(20):
        run = ClaimedRun(
            run_id=uuid.uuid4(),
            claim_token=uuid.uuid4(),
            conversation_id=uuid.uuid4(),
            attempt=1,
            max_attempts=1,
            model="m",
            prompt_id="p",
            system_prompt=None,
            tools=[],
            user_id=None,
            user_message_id=uuid.uuid4(),
            metadata={},
            claim_expires_at=datetime.now(UTC),
        )
        with tracing.attempt(run, "w"):
            pass
    assert len(exporter.get_finished_spans()) == recorded
