"""`runrow serve`'s server spans (pyworker/http/spans.py), read with the SDK's InMemorySpanExporter:
one per request, named by its route's template, a child of the caller's traceparent, and the
parent of a run enqueued in it, so caller → request → the run's attempts is one trace; a 4xx is
not an error and a 5xx is; an event stream's span ends when its head is sent. With tracing off
the header's trace is stored as before: tests/test_tracing.py."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import httpx
import psycopg
import pytest
from agent_support import InProcessWorker
from http_support import ALICE, parse_frames, serve
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from trace_support import spans
from worker_support import wait_status, wait_until, worker_db

from pyworker.fake.server import FakeModel
from pyworker.http.spans import request_attributes

__all__ = ["spans", "worker_db"]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
ENQUEUE = "POST /conversations/{conversation_id}/runs"


def server_span(exporter: InMemorySpanExporter, name: str, path: str) -> ReadableSpan:
    """The ended server span of the request to `path`: it ends as the response does, in the
    server's thread, maybe just after the client has read it."""

    def ended() -> ReadableSpan | None:
        found = [
            s
            for s in exporter.get_finished_spans()
            if s.kind == SpanKind.SERVER and (s.attributes or {}).get("url.path") == path
        ]
        assert len(found) <= 1, found
        return found[0] if found else None

    span = wait_until(ended, 10, f"the span of {path}")
    assert span.name == name
    return span


def stored_traceparent(url: str, run_id: str) -> str | None:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT metadata->>'traceparent' FROM runrow.agent_run WHERE id = %s", (run_id,)
        ).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_an_enqueue_is_a_server_span_under_the_caller_and_over_the_runs_attempts(
    worker_db: str, spans: InMemorySpanExporter
) -> None:
    with (
        FakeModel("text") as fake,
        contextlib.contextmanager(serve)(worker_db, model="claude-fake-1") as server,
    ):
        conversation = uuid.uuid4()
        path = f"/conversations/{conversation}/runs"
        headers = {
            **ALICE,
            "traceparent": TRACEPARENT,
            "tracestate": "congo=t61rcWkgMzE",
            "User-Agent": "t/1",
        }
        sent = httpx.post(server.url + path, json={"content": "Say hello."}, headers=headers, timeout=10)
        assert sent.status_code == 202, sent.text
        run_id = sent.json()["run_id"]
        span = server_span(spans, ENQUEUE, path)
        config = {"anthropic_base_url": fake.base_url, "anthropic_api_key": "test-key"}
        with InProcessWorker(worker_db, "http-traced", config=config):
            with psycopg.connect(worker_db, autocommit=True) as db:
                assert wait_status(db, uuid.UUID(run_id), {"completed", "failed", "dead"}, 60) == "completed"
            attempt = wait_until(
                lambda: next(
                    (
                        s
                        for s in spans.get_finished_spans()
                        if (s.attributes or {}).get("runrow.run_id") == run_id
                    ),
                    None,
                ),
                10,
                "the run's attempt span",
            )
        # The request's span is the caller's span's child, in the caller's trace, its state kept.
        assert format(span.context.trace_id, "032x") == TRACE_ID
        assert span.parent is not None and format(span.parent.span_id, "016x") == PARENT_ID
        assert span.context.trace_state.get("congo") == "t61rcWkgMzE"
        assert span.status.status_code == StatusCode.UNSET
        port = int(server.url.rsplit(":", 1)[1])
        assert dict(span.attributes or {}) == {
            "http.request.method": "POST",
            "http.route": "/conversations/{conversation_id}/runs",
            "http.response.status_code": 202,
            "url.scheme": "http",
            "url.path": path,
            "server.address": "127.0.0.1",
            "server.port": port,
            "client.address": "127.0.0.1",
            "network.protocol.version": "1.1",
            "user_agent.original": "t/1",
        }
        # The run's parent is the request's span: caller → request → attempt, one trace.
        assert stored_traceparent(worker_db, run_id) == f"00-{TRACE_ID}-{span.context.span_id:016x}-01"
        assert attempt.name == "runrow.attempt"
        assert attempt.context.trace_id == span.context.trace_id
        assert attempt.parent is not None and attempt.parent.span_id == span.context.span_id

        # A traceparent the caller put in the run's metadata is the one it named: kept as given.
        own = f"00-{TRACE_ID}-{'1' * 16}-01"
        given = httpx.post(
            f"{server.url}/conversations/{uuid.uuid4()}/runs",
            json={"content": "hi", "metadata": {"traceparent": own}},
            headers=ALICE,
            timeout=10,
        )
        assert given.status_code == 202, given.text
        assert stored_traceparent(worker_db, given.json()["run_id"]) == own


def test_a_4xx_is_not_an_error_and_a_5xx_is(worker_db: str, spans: InMemorySpanExporter) -> None:
    with contextlib.contextmanager(serve)(worker_db) as server:
        bad = f"/conversations/{uuid.uuid4()}/runs"
        invalid = httpx.post(server.url + bad, json={"content": 7}, headers=ALICE, timeout=10)
        assert invalid.status_code == 400, invalid.text
        missing = f"/runs/{uuid.uuid4()}"
        assert httpx.get(server.url + missing, headers=ALICE, timeout=10).status_code == 404
        assert httpx.get(server.url + "/no/such/page", headers=ALICE, timeout=10).status_code == 404
        for path, name, status in [(bad, ENQUEUE, 400), (missing, "GET /runs/{run_id}", 404)]:
            span = server_span(spans, name, path)
            assert span.attributes is not None and span.attributes["http.response.status_code"] == status
            assert span.status.status_code == StatusCode.UNSET, path
            assert "error.type" not in span.attributes
        # No route: named by the method alone (the path is the attribute, never the name).
        unrouted = server_span(spans, "GET", "/no/such/page")
        assert unrouted.attributes is not None and "http.route" not in unrouted.attributes
        assert unrouted.parent is None  # no traceparent sent: a trace of its own

    def broken(request: Any) -> str:
        raise RuntimeError("the authenticator is broken")

    with contextlib.contextmanager(serve)(worker_db, authenticate=broken) as server:
        failed = httpx.get(
            f"{server.url}/runs/{uuid.uuid4()}", headers={"traceparent": TRACEPARENT}, timeout=10
        )
        assert failed.status_code == 500
        span = server_span(spans, "GET /runs/{run_id}", failed.request.url.path)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes is not None and span.attributes["http.response.status_code"] == 500
    assert span.attributes["error.type"] == "RuntimeError"
    assert [event.name for event in span.events] == ["exception"]
    assert format(span.context.trace_id, "032x") == TRACE_ID


def test_an_event_streams_span_ends_when_its_head_is_sent(
    worker_db: str, spans: InMemorySpanExporter
) -> None:
    """The stream stays open (its run is queued, no worker) while its span has ended: a span for
    the stream's life was exported only when the stream closed, hours later or never."""
    with contextlib.contextmanager(serve)(worker_db) as server:
        sent = httpx.post(
            f"{server.url}/conversations/{uuid.uuid4()}/runs",
            json={"content": "hi"},
            headers=ALICE,
            timeout=10,
        )
        run_id = sent.json()["run_id"]
        path = f"/runs/{run_id}/events"
        with (
            httpx.Client(base_url=server.url, timeout=20) as client,
            client.stream("GET", path, headers={**ALICE, "Last-Event-ID": "0"}) as response,
        ):
            assert response.status_code == 200
            span = server_span(spans, "GET /runs/{run_id}/events", path)
            frames = parse_frames(response.iter_lines())
            # Still streaming after the span ended: keepalives come every 0.5 s.
            assert any(frame.comment == "keepalive" for frame in frames)
    assert span.attributes is not None and span.attributes["http.response.status_code"] == 200
    assert span.attributes["runrow.stream.from_seq"] == 0
    assert span.status.status_code == StatusCode.UNSET


@pytest.mark.parametrize(
    ("host", "address", "port"),
    [
        (b"runrow.example:8443", "runrow.example", 8443),
        (b"runrow.example", "runrow.example", None),
        (b"[::1]:8000", "::1", 8000),
        (b"[::1]", "::1", None),
    ],
)
def test_server_address_and_port_are_the_host_header(host: bytes, address: str, port: int | None) -> None:
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "headers": [(b"host", host)],
        "server": ("10.0.0.1", 80),
    }
    attributes = request_attributes(scope, "GET", "/")
    assert attributes["server.address"] == address
    assert attributes.get("server.port") == port
