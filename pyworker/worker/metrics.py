"""Prometheus metrics of a runrow process: what the worker, the agent loop and the HTTP service
count, and the database's gauges read at scrape time.

Everything lives in prometheus_client's default registry (so process_* and python_* come along)
and the sites call one-line helpers below. The worker's own series are registered only in a
process that runs a worker (`register_worker`), the HTTP service's only in one that serves
(pyworker/http/metrics.py): each exports what it can move, not the other's zeros. Labels are
bounded: statuses, outcomes, effects, call names, and models the operator priced
(runrow.model_prices, read by `refresh_models`); any other model counts as "other". A run's
model is the caller's string, so a label per name seen let any enqueuer fill the label set with
junk names and push the real model into "other" for the life of the process. Never a run id, a
user or a tool argument.

The database half is ONE query per scrape (`scrape`): `SELECT * FROM runrow.queue_metrics`, one
row whose every column becomes a gauge by name (migration 0015), so a new database gauge is one
more column in that view and nothing here. Scrapes that arrive while a query is in flight, or
within CACHE_SECONDS of its answer, share it: a scrape storm costs the database one query.
When the query fails, runrow_db_up is 0 and the database gauges are left out of that scrape
rather than reported stale.

Imports nothing of pyworker but pyworker.db: the worker, the agent and HTTP all stand on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("runrow.metrics")

OTHER = "other"
UNKNOWN = "unknown"  # a run without a model string
# Seconds between two reads of the priced models: a price set later gets its own label within
# a minute, and no model call ever waits on (or costs) a query.
MODELS_REFRESH_SECONDS = 60.0
MODELS_QUERY = "SELECT model FROM runrow.model_prices"
# Seconds a scrape's database row is reused by the scrapes after it.
CACHE_SECONDS = 1.0
CONTENT_TYPE = CONTENT_TYPE_LATEST

# Seconds: a claim is milliseconds, a queue wait or an agent run minutes.
_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
_FLUSH_EVENTS_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)

CLAIMS = Counter("runrow_claims", "Runs claimed by this worker.", registry=None)
CLAIM_LATENCY = Histogram(
    "runrow_enqueue_to_claim_seconds",
    "Time a run spent queued before this worker claimed it (database clock).",
    buckets=_WAIT_BUCKETS,
    registry=None,
)
ATTEMPT_DURATION = Histogram(
    "runrow_attempt_duration_seconds",
    "Claim to ending of one attempt on this worker, by how it ended.",
    ["ending"],
    buckets=_WAIT_BUCKETS,
    registry=None,
)
REAPS = Counter(
    "runrow_reaps",
    "Runs this worker's reaper took over after their lease lapsed.",
    ["outcome"],
    registry=None,
)
LEASE_LOSSES = Counter(
    "runrow_lease_losses", "Attempts that lost their claim (reaped, stopped, superseded).", registry=None
)
FENCED = Counter(
    "runrow_fenced_writes",
    "Writes the fence refused (the claim was no longer this worker's).",
    ["call"],
    registry=None,
)
FLUSH_EVENTS = Histogram(
    "runrow_journal_flush_events",
    "Events written per journal flush transaction.",
    buckets=_FLUSH_EVENTS_BUCKETS,
    registry=None,
)
FLUSH_SECONDS = Histogram(
    "runrow_journal_flush_seconds",
    "Duration of one journal flush transaction.",
    buckets=_WAIT_BUCKETS,
    registry=None,
)
MODEL_SECONDS = Histogram(
    "runrow_model_request_seconds",
    "One streamed model request, start to final message, by model and outcome.",
    ["model", "outcome"],
    buckets=_WAIT_BUCKETS,
    registry=None,
)
MODEL_TOKENS = Counter(
    "runrow_model_tokens",
    "Tokens reported by the model API, by model and kind.",
    ["model", "kind"],
    registry=None,
)
MODEL_THROTTLED = Counter(
    "runrow_model_throttled_responses",
    "429 (rate limited) and 529 (overloaded) answers of the model API, including those the SDK retried.",
    ["status"],
    registry=None,
)
MODEL_KEY_ERRORS = Counter(
    "runrow_model_key_errors",
    "API key or account errors of the model API (401, 402, a 403 about the key, credit balance too "
    "low): each blocks the key fleet-wide and defers its run.",
    ["status"],
    registry=None,
)
MODEL_KEY_BROKEN = Gauge(
    "runrow_model_key_broken",
    "1 while this worker's latest model answer was an API key or account error, else 0 (this "
    "worker's view; the fleet's is runrow_rate_limit_keys_key_error).",
    registry=None,
)
MODEL_RATE_LIMIT_EXHAUSTED = Counter(
    "runrow_model_rate_limit_exhausted",
    "Model responses whose rate-limit headers said the requests bucket was empty (remaining 0, "
    "its reset ahead): each blocked the key fleet-wide until one request was back, before any "
    "429. By bucket (requests; the token buckets block nothing).",
    ["bucket"],
    registry=None,
)
MODEL_RATE_LIMIT_REPORT_FAILED = Counter(
    "runrow_model_rate_limit_report_failed",
    "Empty requests buckets (rate-limit headers) the worker could not block the key for within "
    "5 s (the database away or slow, a schema older than the worker): the fleet meets 429s instead.",
    registry=None,
)
MODEL_RATE_LIMIT_REMAINING = Gauge(
    "runrow_model_rate_limit_remaining_ratio",
    "remaining / limit of each rate-limit bucket in this worker's latest model response that "
    "stated both (this worker's view of the organisation's limit, 0 when empty).",
    ["bucket"],
    registry=None,
)
TOOL_CALLS = Counter(
    "runrow_tool_calls", "Tool calls by effect class and outcome.", ["effect", "outcome"], registry=None
)
WEBHOOK_DELIVERIES = Counter(
    "runrow_webhook_deliveries",
    "Webhook delivery attempts this worker made, by outcome: delivered (the receiver answered 2xx), "
    "failed (to be tried again), dead_lettered (the last attempt, or a failure that would recur).",
    ["outcome"],
    registry=None,
)
WEBHOOK_SECONDS = Histogram(
    "runrow_webhook_delivery_seconds",
    "One webhook POST, sent to the receiver's answer (or the error, the timeout), by outcome.",
    ["outcome"],
    buckets=_WAIT_BUCKETS,
    registry=None,
)
HUB_UP = Gauge("runrow_hub_up", "1 while this process's LISTEN connection is up, else 0.")
DB_UP = Gauge("runrow_db_up", "1 if this scrape's database query succeeded, else 0.")
RUNS_IN_FLIGHT = Gauge(
    "runrow_runs_in_flight", "Runs this worker holds now (claimed, not yet ended).", registry=None
)
CONCURRENCY = Gauge("runrow_concurrency", "Runs this worker may hold at once (--concurrency).", registry=None)

# The series only a worker moves, registered by `register_worker()` when a worker starts: a
# `runrow serve` process exported all of them stuck at 0 (a claims counter, runs in flight, the
# model key gauge, the flush histograms), as if it were a worker that never claimed.
WORKER_ONLY = (
    CLAIMS,
    CLAIM_LATENCY,
    ATTEMPT_DURATION,
    REAPS,
    LEASE_LOSSES,
    FENCED,
    FLUSH_EVENTS,
    FLUSH_SECONDS,
    MODEL_SECONDS,
    MODEL_TOKENS,
    MODEL_THROTTLED,
    MODEL_KEY_ERRORS,
    MODEL_KEY_BROKEN,
    MODEL_RATE_LIMIT_EXHAUSTED,
    MODEL_RATE_LIMIT_REPORT_FAILED,
    MODEL_RATE_LIMIT_REMAINING,
    TOOL_CALLS,
    WEBHOOK_DELIVERIES,
    WEBHOOK_SECONDS,
    RUNS_IN_FLIGHT,
    CONCURRENCY,
)
_registered: set[int] = set()
_register_lock = threading.Lock()


def register(collectors: Iterable[Collector]) -> None:
    """Export these (made with registry=None) from this process; again is a no-op."""
    with _register_lock:
        for collector in collectors:
            if id(collector) not in _registered:
                REGISTRY.register(collector)
                _registered.add(id(collector))


def register_worker() -> None:
    """This process runs a worker: export the worker's series (a Worker calls it as it starts)."""
    register(WORKER_ONLY)


TOKEN_KINDS = {
    "input_tokens": "input",
    "output_tokens": "output",
    "cache_read_input_tokens": "cache_read",
    "cache_creation_input_tokens": "cache_write",
}

# The models that get a label of their own: the priced ones, as last read. Replaced whole,
# never mutated, so model_label reads it without a lock from any thread.
_known_models: frozenset[str] = frozenset()


def model_label(model: object) -> str:
    """The model as a label value: its name if the operator priced it (runrow.model_prices, as
    last read), "unknown" without a name, else "other"."""
    if not isinstance(model, str) or not model:
        return UNKNOWN
    return model if model in _known_models else OTHER


def set_known_models(models: Iterable[str]) -> None:
    global _known_models
    _known_models = frozenset(m for m in models if isinstance(m, str) and m)


async def refresh_models(pool: Any, timeout: float = 5.0) -> None:  # noqa: ASYNC109
    """Read the priced models (one query of the documented view); raises if the read fails,
    leaving the last set in place."""
    async with asyncio.timeout(timeout):
        async with pool.connection() as conn:
            cur = await conn.execute(MODELS_QUERY)
            rows = await cur.fetchall()
    set_known_models(row[0] for row in rows)


async def watch_models(pool: Any, every: float = MODELS_REFRESH_SECONDS) -> None:
    """Re-read the priced models every `every` seconds, for as long as the process runs; a failed
    read keeps the last set (warned once per outage, the scrape's db_up says the rest)."""
    failing = False
    while True:
        await asyncio.sleep(every)
        try:
            await refresh_models(pool)
        except Exception as exc:
            if not failing:
                log.warning(
                    "metrics: reading the priced models failed, keeping the last: %s", exc or repr(exc)
                )
            failing = True
        else:
            failing = False


def claimed(queued_seconds: float | None) -> None:
    CLAIMS.inc()
    if queued_seconds is not None:
        CLAIM_LATENCY.observe(max(0.0, queued_seconds))


def attempt_ended(ending: str | None, seconds: float) -> None:
    ATTEMPT_DURATION.labels(ending or "none").observe(seconds)
    if ending == "lost":
        LEASE_LOSSES.inc()


def reaped(outcomes: Iterable[str]) -> None:
    for outcome in outcomes:
        REAPS.labels(outcome).inc()


def fenced(call: str, n: int = 1) -> None:
    if n:
        FENCED.labels(call).inc(n)


def journal_flushed(events: int, seconds: float) -> None:
    FLUSH_EVENTS.observe(events)
    FLUSH_SECONDS.observe(seconds)


def model_usage(model: object, usage: dict[str, Any] | None) -> None:
    label = model_label(model)
    for field, kind in TOKEN_KINDS.items():
        value = (usage or {}).get(field)
        if isinstance(value, int) and value > 0:
            MODEL_TOKENS.labels(label, kind).inc(value)


@contextlib.contextmanager
def model_request(model: object) -> Iterator[dict[str, str]]:
    """Time a model request: outcome "ok", "error" (it raised) or "cancelled"; the caller may
    set result["outcome"] itself (a stop that ends the stream is a "cancelled", not an error)."""
    result = {"outcome": "ok"}
    started = time.monotonic()
    try:
        yield result
    except asyncio.CancelledError:
        result["outcome"] = "cancelled"
        raise
    except BaseException:
        if result["outcome"] == "ok":
            result["outcome"] = "error"
        raise
    finally:
        MODEL_SECONDS.labels(model_label(model), result["outcome"]).observe(time.monotonic() - started)


async def on_model_response(response: Any) -> None:
    """An httpx event hook: sees every response, also the ones the SDK retries on its own."""
    status = getattr(response, "status_code", None)
    if status in (429, 529):
        MODEL_THROTTLED.labels(str(status)).inc()


def model_key_error(status: int | None) -> None:
    MODEL_KEY_ERRORS.labels(str(status)).inc()
    MODEL_KEY_BROKEN.set(1)


def model_key_works() -> None:
    MODEL_KEY_BROKEN.set(0)


def model_rate_limits(remaining: Iterable[tuple[str, int, int | None]], exhausted: str | None) -> None:
    """A model response's rate-limit headers: (bucket, remaining, limit) as read, and the bucket
    that blocked the key (None: none did)."""
    for bucket, left, limit in remaining:
        if limit:
            MODEL_RATE_LIMIT_REMAINING.labels(bucket).set(min(1.0, left / limit))
    if exhausted is not None:
        MODEL_RATE_LIMIT_EXHAUSTED.labels(exhausted).inc()


def model_rate_limit_report_failed() -> None:
    MODEL_RATE_LIMIT_REPORT_FAILED.inc()


def tool_call(effect: str | None, outcome: str) -> None:
    TOOL_CALLS.labels(effect or "unknown", outcome).inc()


def webhook_delivery(outcome: str, seconds: float) -> None:
    WEBHOOK_DELIVERIES.labels(outcome).inc()
    WEBHOOK_SECONDS.labels(outcome).observe(seconds)


def watch_hub(connected: Callable[[], bool]) -> None:
    """runrow_hub_up follows `connected` at every scrape (the latest hub of the process wins)."""
    HUB_UP.set_function(lambda: 1.0 if connected() else 0.0)


def watch_runs(in_flight: Callable[[], int], concurrency: int) -> None:
    """runrow_runs_in_flight follows `in_flight` at every scrape, beside the worker's
    concurrency: together they say how full the worker is (the latest worker of the process wins)."""
    RUNS_IN_FLIGHT.set_function(lambda: float(in_flight()))
    CONCURRENCY.set(concurrency)


# -- the database half --------------------------------------------------------------------------

# queue_metrics columns that are one status of the queue depth gauge.
STATUS_COLUMNS = ("queued", "running", "waiting")
HELP = {
    "waiting_approval": "Runs parked on a person's approval.",
    "oldest_queued_age_seconds": "How long the longest-waiting claimable run has waited since it became "
    "claimable (0: none is).",
    "leases_expired": "Running runs whose lease lapsed and that no reaper has taken yet.",
    "queued_claimable": "Queued runs a worker could claim now (due, not behind their conversation's turn).",
    "queued_not_due": "Queued runs waiting out start_in or a retry_in backoff.",
    "rate_limit_keys_blocked": "Rate-limit keys blocked now, by a reported 429 or an API key error.",
    "rate_limit_keys_key_error": "Rate-limit keys whose API key or account error has not cleared "
    "(blocked, or between a block and its probe's answer): alert when above 0.",
    "tenants_over_budget": "Tenants at their daily token or cost budget.",
    "webhooks_pending": "Webhook deliveries not yet made (new, retrying or in flight).",
    "webhooks_dead_lettered": "Webhook deliveries that gave up (retry_webhook_delivery re-arms one).",
    "oldest_pending_webhook_age_seconds": "Age of the oldest undelivered webhook (0: none).",
    "schedules_overdue": "Schedules whose next tick is more than 5 minutes past due: no pass fired it.",
    "oldest_due_tick_age_seconds": "How long the oldest due schedule tick not fired yet has been due "
    "(0: none).",
    "schedules_with_last_error": "Schedules whose last tick enqueued nothing, that a pass left due, or "
    "whose cron stopped them (runrow.schedules says why).",
    "queued_blocked": "Queued runs due but held behind another turn of their conversation (running, "
    "waiting on an approval, or an earlier queued turn).",
    "oldest_blocked_age_seconds": "How long the longest-held of the blocked queued runs has been held "
    "(0: none): a conversation stuck behind an unanswered approval grows it.",
}
SCRAPE_QUERY = "SELECT * FROM runrow.queue_metrics"


class _DatabaseGauges(Collector):
    """Yields the row of the last scrape query; nothing when it failed or never ran."""

    def __init__(self) -> None:
        self.row: dict[str, Any] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        row = self.row
        if row is None:
            return
        depth = GaugeMetricFamily("runrow_queue_depth", "Runs by live status, now.", labels=["status"])
        for status in STATUS_COLUMNS:
            if row.get(status) is not None:
                depth.add_metric([status], float(row[status]))
        yield depth
        for column, value in row.items():
            if column in STATUS_COLUMNS or not isinstance(value, int | float) or isinstance(value, bool):
                continue
            help_text = HELP.get(column, f"runrow.queue_metrics.{column}")
            yield GaugeMetricFamily(f"runrow_{column}", help_text, value=float(value))


_database = _DatabaseGauges()
REGISTRY.register(_database)


class _Reads:
    """The database half of the scrapes against one pool: one query at a time, its answer
    reused for CACHE_SECONDS. A task of its own, shielded from the scrapes awaiting it, so a
    scrape whose client hung up does not cancel the query the others wait for."""

    def __init__(self) -> None:
        self.task: asyncio.Task[dict[str, Any] | None] | None = None
        self.answered = float("-inf")  # time.monotonic() of the last answer

    async def row(self, pool: Any, timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109
        task = self.task
        if task is None or (task.done() and time.monotonic() - self.answered >= CACHE_SECONDS):
            task = self.task = asyncio.ensure_future(self._query(pool, timeout))
        return await asyncio.shield(task)

    async def _query(self, pool: Any, timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109
        try:
            async with asyncio.timeout(timeout):
                async with pool.connection() as conn:
                    cur = await conn.execute(SCRAPE_QUERY)
                    values = await cur.fetchone()
                    names = [d.name for d in cur.description or ()]
            return dict(zip(names, values or (), strict=False))
        except Exception as exc:
            # A TimeoutError has no text: say what happened rather than log an empty reason.
            reason = (
                f"no answer within {timeout:g} s" if isinstance(exc, TimeoutError) else str(exc) or repr(exc)
            )
            log.warning("metrics scrape: the database query failed: %s", reason)
            return None
        finally:
            self.answered = time.monotonic()


# Per pool: a pool belongs to one event loop, and so does the query task in flight against it.
_reads: weakref.WeakKeyDictionary[Any, _Reads] = weakref.WeakKeyDictionary()
_reads_lock = threading.Lock()


async def scrape(pool: Any, timeout: float = 5.0) -> bytes:  # noqa: ASYNC109
    """The exposition text: the database row (one query, shared by the scrapes within
    CACHE_SECONDS of it), then every metric. `pool`: what the query borrows a connection from;
    a worker gives it a connection of its own (pyworker/worker/process.py), since its run pool
    may be held by handlers for as long as they like."""
    with _reads_lock:
        reads = _reads.setdefault(pool, _Reads())
    row = await reads.row(pool, timeout)
    _database.row = row
    DB_UP.set(0 if row is None else 1)
    return generate_latest(REGISTRY)


async def serve(pool: Any, host: str, port: int) -> asyncio.Server:
    """A minimal HTTP server for `runrow worker --metrics-port`: GET /metrics, 404 otherwise.
    On the worker's own event loop; `pool` is the scrapes' own (one connection), never the runs'
    pool. Port 0 picks a free port."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10):
                request = await reader.readline()
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # headers: nothing here depends on them
            parts = request.decode("latin-1").split()
            if len(parts) >= 2 and parts[0] == "GET" and parts[1].split("?")[0] == "/metrics":
                status, ctype, body = "200 OK", CONTENT_TYPE, await scrape(pool)
            else:
                status, ctype, body = "404 Not Found", "text/plain; charset=utf-8", b"GET /metrics\n"
            head = f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
            await writer.drain()
        except ValueError:
            # A request or header line past the reader's 64 KiB limit (a LimitOverrunError inside):
            # it reached asyncio's handler as an ERROR traceback per connection, on a port that
            # `runrow serve --metrics-host 0.0.0.0` may open to anyone.
            with contextlib.suppress(ConnectionError):
                writer.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n")
                writer.write(b"Connection: close\r\n\r\n")
                await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port)
