"""OpenTelemetry traces of runs: one trace per run, a span per attempt, and inside it a span per
model request and per tool call. Optional: without the `otel` extra (opentelemetry-api) every
helper here is a no-op and nothing is imported.

Which trace: the run's `metadata.traceparent` (W3C Trace Context, given at enqueue over SQL or as
the `traceparent` header of POST /conversations/{id}/runs; enqueue_run validates it), so every
attempt, on whichever worker claims it, is a child of the caller's span and a resumed run stays in
the caller's trace. A run enqueued without one gets the trace id of its run id (the uuid's 128
bits, as hex): its attempts still share one trace, found by the run id, under a parent span that
nobody exports (the run itself).

Spans go to the process's global tracer provider: `configure_from_env` installs the SDK's for
OTEL_TRACES_EXPORTER=console or otlp (the OTLP exporter package is the user's to install); a
handler or embedding application may install its own instead. While none is installed (the API's
default proxy) no span is made at all, so an untraced worker pays nothing per attempt for them.

The tool-call span also counts the call (runrow_tool_calls, pyworker/worker/metrics.py), so a
site needs one `with`.

Imports only pyworker.db (and the worker's metrics module).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyworker.db.api import ClaimedRun
from pyworker.worker import metrics

log = logging.getLogger("runrow.tracing")

try:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _NOT_RECORDING = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
except ImportError:  # the `otel` extra is not installed: no traces
    trace = None  # type: ignore[assignment]

ENABLED = trace is not None
TRACER = "runrow"


def tracer(name: str = TRACER) -> Any:
    """The runrow tracer (`name`: its instrumentation scope), or None while the process has no
    tracer provider (the API's default proxy, or its no-op one): their spans record nothing, yet
    each would cost its attributes, parent context and context switch, per attempt or request.
    Asked at every span, not once at startup, because a handler or the embedding application may
    install a provider at any time."""
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, _NOT_RECORDING):
        return None
    return provider.get_tracer(name)


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span, or None unless one is recording: what a run
    enqueued inside it stores as metadata.traceparent to be its child (pyworker/http/spans.py's
    server span). A span nobody records (sampled out, or no provider) would only cut the run
    from the caller's own trace."""
    if trace is None:
        return None
    span = trace.get_current_span()
    if not span.is_recording() or not span.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(span))
    return carrier.get("traceparent")


def _parent(run: ClaimedRun) -> Any:
    """The context the attempt span is a child of: the caller's traceparent, else the run's own."""
    assert trace is not None
    traceparent = (run.metadata or {}).get("traceparent")
    if isinstance(traceparent, str):
        extracted = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
        if trace.get_current_span(extracted).get_span_context().is_valid:
            return extracted
    run_bits = run.run_id.int
    span_id = (run_bits & ((1 << 64) - 1)) or 1
    flags = TraceFlags(TraceFlags.SAMPLED if _root_sampled(run_bits) else TraceFlags.DEFAULT)
    own = SpanContext(run_bits, span_id, is_remote=True, trace_flags=flags)
    return trace.set_span_in_context(NonRecordingSpan(own))


def _root_sampled(trace_id: int) -> bool:
    """Whether the provider's sampler samples a new trace with this id. The stand-in parent of a
    run without a traceparent was always marked sampled, so a parent-based sampler (the SDK's
    default, and OTEL_TRACES_SAMPLER=parentbased_traceidratio) recorded every such run whatever
    its ratio. Asked as for a root, which depends on the trace id only: every attempt of the run,
    on any worker, gets the same answer. A provider without a sampler (not the SDK's) samples."""
    assert trace is not None
    sampler = getattr(trace.get_tracer_provider(), "sampler", None)
    if sampler is None:
        return True
    try:
        result = sampler.should_sample(None, trace_id, "runrow.attempt")
    except Exception:  # a custom sampler that cannot answer for a root: keep the trace
        return True
    return bool(result.decision.is_sampled())


@contextlib.contextmanager
def attempt(run: ClaimedRun, worker_id: str) -> Iterator[Any]:
    """The span of one attempt, current for the code (and the tasks it starts) inside; None
    without a tracer provider."""
    spans = tracer()
    if spans is None:
        yield None
        return
    attributes = {
        "runrow.run_id": str(run.run_id),
        "runrow.conversation_id": str(run.conversation_id),
        "runrow.attempt": run.attempt,
        "runrow.max_attempts": run.max_attempts,
        "runrow.worker_id": worker_id,
        "gen_ai.request.model": run.model,
    }
    with spans.start_as_current_span(
        "runrow.attempt", context=_parent(run), kind=SpanKind.CONSUMER, attributes=attributes
    ) as span:
        yield span


def attempt_ended(span: Any, ending: str | None) -> None:
    """The attempt's ending as runrow.ending; ERROR status for an attempt that failed (failed,
    abandoned, released:*). A deferral (a fleet limit's wait) leaves it unset: waiting for the
    fleet is not the run failing, and an ERROR per rate-limited run made error-rate alerts fire
    on a busy fleet."""
    if span is None:
        return
    span.set_attribute("runrow.ending", ending or "none")
    if ending in ("failed", "abandoned") or (ending or "").startswith("released:"):
        span.set_status(Status(StatusCode.ERROR, ending))


@contextlib.contextmanager
def model_request(model: str) -> Iterator[Any]:
    spans = tracer()
    if spans is None:
        yield None
        return
    attributes = {
        "gen_ai.system": "anthropic",
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model,
    }
    with spans.start_as_current_span(f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes) as span:
        yield span


def model_turn(
    span: Any,
    model: str | None,
    usage: dict[str, Any] | None,
    request_id: str | None,
    stop_reason: str | None,
) -> None:
    """What came back: model, tokens, request id, stop reason."""
    if span is None:
        return
    values: dict[str, Any] = {
        "gen_ai.response.model": model,
        "gen_ai.response.finish_reasons": [stop_reason] if stop_reason else None,
        "anthropic.request_id": request_id,
    }
    for field, kind in metrics.TOKEN_KINDS.items():
        values[f"gen_ai.usage.{kind}_tokens"] = (usage or {}).get(field)
    for key, value in values.items():
        if value is not None:
            span.set_attribute(key, value)


def request_failed(span: Any, request_id: str | None, message: str) -> None:
    if span is None:
        return
    if request_id:
        span.set_attribute("anthropic.request_id", request_id)
    span.set_status(Status(StatusCode.ERROR, message[:200]))


@dataclass
class ToolCall:
    """What the site knows as the call goes on: its state (begin_tool_call) and outcome."""

    state: str | None = None
    outcome: str | None = None


@contextlib.contextmanager
def tool_call(name: str, effect: str) -> Iterator[ToolCall]:
    """A span per tool call (name, effect, state, outcome) and the runrow_tool_calls count.
    Outcome: what the site set, else "ok", or "error" when the block raised."""
    call = ToolCall()
    span_cm: Any = contextlib.nullcontext()
    spans = tracer()
    if spans is not None:
        span_cm = spans.start_as_current_span(
            f"execute_tool {name}",
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "runrow.tool.effect": effect,
            },
        )
    with span_cm as span:
        try:
            yield call
        except BaseException:
            call.outcome = call.outcome or "error"
            raise
        finally:
            call.outcome = call.outcome or "ok"
            metrics.tool_call(effect, call.outcome)
            if span is not None:
                if call.state is not None:
                    span.set_attribute("runrow.tool.state", call.state)
                span.set_attribute("runrow.tool.outcome", call.outcome)
                if call.outcome == "error":
                    span.set_status(Status(StatusCode.ERROR))


def configure_from_env() -> None:
    """The SDK's tracer provider for OTEL_TRACES_EXPORTER=console|otlp; otherwise nothing (the
    global provider stays whatever the process set, by default a no-op)."""
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not exporter_name or exporter_name == "none":
        return
    if trace is None:
        log.warning("OTEL_TRACES_EXPORTER=%s but the otel extra is not installed: no traces", exporter_name)
        return
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.warning(
            "OTEL_TRACES_EXPORTER=%s needs opentelemetry-sdk (the otel extra): no traces", exporter_name
        )
        return
    exporter: Any
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    elif exporter_name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("OTEL_TRACES_EXPORTER=otlp needs opentelemetry-exporter-otlp-proto-http: no traces")
            return
        exporter = OTLPSpanExporter()
    else:
        log.warning(
            "OTEL_TRACES_EXPORTER=%s is not one runrow knows (console, otlp): no traces", exporter_name
        )
        return
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "runrow")})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
