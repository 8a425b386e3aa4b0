"""The trace tests' fixtures: a tracer provider exporting to memory for the test's length, and
tracing off (no provider, as a process started without OTEL_TRACES_EXPORTER).

Neither installs a provider for the process (the API takes one, for good): the provider is what
`trace.get_tracer_provider` answers during the test only, so the tests after it, on this xdist
worker, run untraced as they were written to (a traced `runrow serve` stores its request's span
as a run's metadata.traceparent)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_exporter = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(_exporter))


class _Untraced(trace.ProxyTracerProvider):
    """The API's default provider as runrow sees it (no tracing), whose tracers are the in-memory
    provider's all the same: a span made without asking pyworker.worker.tracing is caught."""

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _provider.get_tracer(*args, **kwargs)


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Every span ended during the test, in memory."""
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: _provider)
    _exporter.clear()
    yield _exporter
    _exporter.clear()


@pytest.fixture
def untraced(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Tracing off; the exporter yielded holds any span made regardless."""
    monkeypatch.setattr(trace, "get_tracer_provider", _Untraced)
    _exporter.clear()
    yield _exporter
    _exporter.clear()
