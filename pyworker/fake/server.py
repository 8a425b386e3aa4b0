"""A fake Anthropic Messages API: a real HTTP/1.1 server on loopback that the real SDK talks to.

    with FakeModel(scenario="demo") as fake:          # or: async with FakeModel(...) as fake
        client = anthropic.Anthropic(base_url=fake.base_url, api_key="test")
        fake.inject(rate_limited(0.01))              # the next request gets a 429

The server runs an asyncio loop in a background thread, so sync tests, async code and other
threads can all use it; `runrow fake-model` serves it from a separate process. Streams are sent
with chunked transfer encoding, like the real API, so a connection cut mid-body is visible to the
client as a protocol error rather than a short but well-formed stream.

Control endpoints (for another process): POST /_control/faults {"faults": [fault | null, ...]},
POST /_control/account_error {"fault": fault | null} (answered to every request until cleared),
POST /_control/scenario {"scenario": name}, POST /_control/reset, GET /_control/requests.
Per request, the header `x-fake-scenario: NAME` overrides the server's scenario.

Refusals stick, as the API documents ("Reset context after refusal"): once an answer ends with
stop_reason refusal, any later request whose history (every message but the last) still holds the
refused message or that answer is refused again, whatever the scenario; reset() forgets them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

from pyworker.fake import protocol as wire
from pyworker.fake.cache import PromptCache, prompt_tokens
from pyworker.fake.faults import Fault
from pyworker.fake.ratelimit import RateLimit
from pyworker.fake.scenarios import ModelRequest, Scenario, Text, Turn, conversation_step, resolve_scenario

log = logging.getLogger("runrow.fake_model")


def _refused_again(request: ModelRequest) -> Turn:
    return Turn(
        (Text("I can't continue this conversation."),),
        stop_reason="refusal",
        stop_details={
            "type": "refusal",
            "category": None,
            "explanation": "The conversation still holds a refused exchange: reset the context.",
        },
    )


DEFAULT_SECRET = b"runrow-fake-model-signing-key"
REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    402: "Payment Required",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    529: "Overloaded",
}
MAX_BODY = 32 * 1024 * 1024


@dataclass
class RecordedRequest:
    """One request the server received, for tests to inspect."""

    number: int
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    request_id: str
    status: int = 0
    outcome: str = ""  # ok, error, error_event, dropped, ended_early, garbled, client_closed
    fault: Fault | None = None
    response: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "method": self.method,
            "path": self.path,
            "headers": self.headers,
            "body": self.body,
            "request_id": self.request_id,
            "status": self.status,
            "outcome": self.outcome,
            "fault": self.fault.to_json() if self.fault else None,
            "response": self.response,
        }


@dataclass
class _HttpRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class _State:
    scenario_name: str
    scenario: Scenario
    faults: deque[Fault | None] = field(default_factory=deque)
    account_error: Fault | None = None
    # Refusals of one kind of request: a request whose body holds the text gets the fault.
    request_errors: dict[str, Fault] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    served: dict[bytes, int] = field(default_factory=dict)
    # Digests (wire.canonical_message) of the refused exchanges: each refused request's last
    # message and the answer that refused it.
    refused: set[bytes] = field(default_factory=set)


class FakeModel:
    def __init__(
        self,
        scenario: str | Scenario = "text",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        secret: bytes = DEFAULT_SECRET,
        api_key: str | None = None,
        faults: Iterable[Fault | None] = (),
        delta_delay: float = 0.0,
        chunk_size: int = 12,
        merge_consecutive: bool = False,
        context_window: int = 200_000,
        clock: Callable[[], float] = time.monotonic,
        rate_limit: RateLimit | None = None,
    ):
        """`scenario`: a name from fake_scenarios.SCENARIOS or a callable. `api_key`: when set, the only
        key accepted (else any non-empty key). `faults`: applied to the next /v1/messages requests, one
        each, in order (None = no fault). `delta_delay`: seconds before every streamed event.
        `merge_consecutive`: merge same-role turns as today's API does, instead of refusing them.
        `context_window`: tokens (estimated as characters / 4); a longer input is refused (400), and
        output that would overflow it stops with model_context_window_exceeded. Output is also cut at
        the request's max_tokens (stop_reason max_tokens) and at the first of its stop_sequences
        in a text block (stop_reason stop_sequence, `stop_sequence` the one met), like the real API.
        `clock`: seconds, for the prompt cache's TTLs (`prompt_cache`, pyworker/fake/cache.py);
        inject one to expire entries.
        `rate_limit`: a requests-per-period token bucket; every /v1/messages answer states it in
        the API's rate-limit headers (limit, remaining, reset, date), and an empty one answers
        429 with retry-after and counts the refusal (pyworker/fake/ratelimit.py)."""
        self.rate_limit = rate_limit
        self.host = host
        self.port = port
        self.signer = wire.Signer(secret)
        self.api_key = api_key
        self.delta_delay = delta_delay
        self.chunk_size = chunk_size
        self.merge_consecutive = merge_consecutive
        self.context_window = context_window
        self.prompt_cache = PromptCache(clock)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        name = scenario if isinstance(scenario, str) else getattr(scenario, "__name__", "custom")
        self._state = _State(name, resolve_scenario(scenario), deque(faults))
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._connections: dict[asyncio.StreamWriter, asyncio.Task[Any]] = {}

    # -- life cycle ---------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FakeModel:
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._run_thread, name="fake-model", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._startup_error is not None:
            raise self._startup_error
        return self

    def stop(self) -> None:
        if self._thread is None or self._loop is None or self._stopping is None:
            return
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(10)
        self._thread = None

    def __enter__(self) -> FakeModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> FakeModel:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    def _run_thread(self) -> None:
        try:
            asyncio.run(self.serve())
        except BaseException as exc:  # reported to start()
            self._startup_error = exc
            self._ready.set()

    async def serve(self, on_ready: Any = None) -> None:
        """Serve until stop() (or cancellation). Runs in the caller's loop: the CLI uses it directly."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._connection, self.host, self.port)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        if on_ready is not None:
            on_ready(self)
        try:
            await self._stopping.wait()
        finally:
            server.close()
            tasks = list(self._connections.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await server.wait_closed()

    # -- what tests use -----------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every /v1/messages request so far, oldest first."""
        with self._lock:
            return [r for r in self._state.requests if r.path.startswith("/v1/")]

    @property
    def request_count(self) -> int:
        return len(self.requests)

    @property
    def scenario_name(self) -> str:
        return self._state.scenario_name

    def inject(self, *faults: Fault | None) -> None:
        """Queue faults for the next requests, one per request (None: that request is served normally)."""
        with self._lock:
            self._state.faults.extend(faults)

    def set_account_error(self, fault: Fault | None) -> None:
        """Answer every /v1/messages request with this `status` fault until it is cleared (None):
        what the API does while the key is revoked or the account has no credit
        (faults.invalid_api_key(), billing_error(), credit_balance_too_low(), permission_denied()).
        Queued faults wait behind it."""
        if fault is not None and fault.kind != "status":
            raise ValueError("an account error is a status fault")
        with self._lock:
            self._state.account_error = fault

    def refuse_requests_with(self, text: str, fault: Fault | None) -> None:
        """Answer every /v1/messages request whose body holds `text` with this `status` fault
        (None: no longer), and serve the others: what the API does with a request using
        something the organisation may not use (a beta, a tool type, a file), while the key
        works for every other request (faults.permission_denied("...")). Before queued faults."""
        if fault is not None and fault.kind != "status":
            raise ValueError("a request's refusal is a status fault")
        with self._lock:
            if fault is None:
                self._state.request_errors.pop(text, None)
            else:
                self._state.request_errors[text] = fault

    def set_scenario(self, scenario: str | Scenario) -> None:
        resolved = resolve_scenario(scenario)
        with self._lock:
            self._state.scenario = resolved
            self._state.scenario_name = scenario if isinstance(scenario, str) else "custom"

    def reset(self) -> None:
        with self._lock:
            self._state.faults.clear()
            self._state.account_error = None
            self._state.request_errors.clear()
            self._state.requests.clear()
            self._state.served.clear()
            self._state.refused.clear()
        self.prompt_cache.clear()

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> list[RecordedRequest]:
        """Block until `count` /v1/messages requests have been answered (or raise TimeoutError)."""
        with self._changed:
            ok = self._changed.wait_for(lambda: sum(self._finished()) >= count, timeout)
        if not ok:
            raise TimeoutError(f"fake model: {count} requests not answered within {timeout}s")
        return self.requests

    def _finished(self) -> list[bool]:
        return [bool(r.outcome) for r in self._state.requests if r.path.startswith("/v1/")]

    # -- HTTP ---------------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[writer] = task
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    break
                if not await self._dispatch(request, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        except asyncio.CancelledError:
            # The server is stopping: end this connection task quietly (asyncio logs a cancelled one).
            writer.transport.abort()
            return
        finally:
            self._connections.pop(writer, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _record(self, request: _HttpRequest, body: Any, request_id: str) -> RecordedRequest:
        with self._lock:
            record = RecordedRequest(
                number=len(self._state.requests) + 1,
                method=request.method,
                path=request.path,
                headers=dict(request.headers),
                body=body,
                request_id=request_id,
            )
            self._state.requests.append(record)
            return record

    def _finish(self, record: RecordedRequest, status: int, outcome: str) -> None:
        with self._changed:
            record.status = status
            record.outcome = outcome
            self._changed.notify_all()

    async def _dispatch(self, request: _HttpRequest, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection must not be reused."""
        request_id = "req_011" + secrets.token_urlsafe(18).replace("-", "x").replace("_", "y")
        try:
            body = json.loads(request.body) if request.body else None
        except ValueError:
            body = None
            parse_error: str | None = "There was an error parsing the body of your request: invalid JSON"
        else:
            parse_error = None
        record = self._record(request, body, request_id)
        path = request.path.split("?", 1)[0]
        limit_headers: dict[str, str] = {}  # the rate limit's, on every answer to the request
        try:
            if path.startswith("/_control/"):
                result = self._control(request.method, path, body)
                self._finish(record, 200, "ok")
                await _send_json(writer, 200, result, request_id)
                return True
            if path not in ("/v1/messages", "/v1/messages/count_tokens"):
                raise wire.ApiError(404, "not_found_error", f"Not found: {request.method} {path}")
            if request.method != "POST":
                raise wire.ApiError(405, "invalid_request_error", f"Method {request.method} not allowed")
            self._authenticate(request.headers)
            if path == "/v1/messages" and self.rate_limit is not None:
                answer = self.rate_limit.take()
                limit_headers = answer.headers()
                if answer.wait is not None:
                    raise wire.ApiError(
                        429, "rate_limit_error", "Number of requests has exceeded your rate limit"
                    )
            if path == "/v1/messages":
                fault = self._next_fault(request.body)
                record.fault = fault
                if fault is not None and fault.kind == "status":
                    raise wire.ApiError(fault.status, fault.error_type, fault.message, fault.retry_headers())
            if parse_error is not None:
                raise wire.invalid(parse_error)
            counting = path == "/v1/messages/count_tokens"
            valid = wire.validate(
                body, self.signer, merge_consecutive=self.merge_consecutive, require_max_tokens=not counting
            )
            if counting:
                self._finish(record, 200, "ok")
                await _send_json(writer, 200, {"input_tokens": prompt_tokens(valid)}, request_id)
                return True
            return await self._messages(valid, request, writer, record, fault, limit_headers)
        except wire.ApiError as err:
            self._finish(record, err.status, "error")
            await _send_json(
                writer,
                err.status,
                wire.error_body(err.error_type, err.message, request_id),
                request_id,
                {**limit_headers, **err.headers},
            )
            return True
        except ConnectionError:
            if not record.outcome:
                self._finish(record, 200, "client_closed")
            return False

    def _authenticate(self, headers: Mapping[str, str]) -> None:
        key = headers.get("x-api-key")
        if key is None and headers.get("authorization", "").lower().startswith("bearer "):
            key = headers["authorization"][7:]
        if not key:
            raise wire.ApiError(401, "authentication_error", "x-api-key header is required")
        if self.api_key is not None and key != self.api_key:
            raise wire.ApiError(401, "authentication_error", "invalid x-api-key")
        if not headers.get("anthropic-version"):
            raise wire.invalid("anthropic-version: header is required")

    def _remember_refusal(self, refused: Mapping[str, Any], answer: list[dict[str, Any]]) -> None:
        """As the API: once the model refused, a request whose history still holds the refused
        exchange (the message it refused, or its answer) is refused again ("Attempting to continue
        without resetting will result in continued refusals"). The message sent again as the last
        one of a request is the scenario's to judge."""
        with self._lock:
            self._state.refused.add(wire.digest(wire.canonical_message(refused)))
            if answer:
                exchange = {"role": "assistant", "content": answer}
                self._state.refused.add(wire.digest(wire.canonical_message(exchange)))

    def _next_fault(self, raw: bytes) -> Fault | None:
        with self._lock:
            if self._state.account_error is not None:
                return self._state.account_error
            for text, fault in self._state.request_errors.items():
                if text.encode() in raw:
                    return fault
            return self._state.faults.popleft() if self._state.faults else None

    def _turn_for(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> tuple[Any, Fault | None]:
        override = headers.get("x-fake-scenario")
        with self._lock:
            scenario = resolve_scenario(override) if override else self._state.scenario
            history = body["messages"][:-1]
            if any(wire.digest(wire.canonical_message(m)) in self._state.refused for m in history):
                scenario = _refused_again
        try:
            turn = wire.honour_tool_choice(
                scenario(ModelRequest(body=body, step=conversation_step(body["messages"]))), body
            )
        except wire.ApiError:
            raise
        except Exception as exc:
            log.exception("fake model scenario failed")
            raise wire.ApiError(500, "api_error", f"scenario failed: {exc}") from exc
        key = wire.context_digest(body, body["messages"], [override or self._state.scenario_name])
        with self._lock:
            served = self._state.served.get(key, 0)
            self._state.served[key] = served + 1
        fault = turn.faults[served] if served < len(turn.faults) else None
        return turn, fault

    async def _messages(
        self,
        body: dict[str, Any],
        request: _HttpRequest,
        writer: asyncio.StreamWriter,
        record: RecordedRequest,
        fault: Fault | None,
        extra: Mapping[str, str],
    ) -> bool:
        turn, turn_fault = self._turn_for(body, request.headers)
        fault = fault or turn_fault
        record.fault = fault
        if fault is not None and fault.kind == "status":
            raise wire.ApiError(fault.status, fault.error_type, fault.message, fault.retry_headers())
        in_tokens = prompt_tokens(body)
        if in_tokens > self.context_window:
            raise wire.invalid(f"prompt is too long: {in_tokens} tokens > {self.context_window} maximum")
        # The prompt is processed (and cached) before the first byte of the answer, so a stream cut
        # later, or a client that goes away, leaves its cache entries behind, as with the API.
        cached = self.prompt_cache.account(body)
        content = wire.render_content(turn, body, self.signer)
        content, sequence = wire.stop_at_sequence(content, body.get("stop_sequences"))
        content, cut = wire.limit_output(content, body["max_tokens"], self.context_window - in_tokens)
        if cut is None and sequence is not None:
            cut = "stop_sequence"
        else:
            sequence = None
        out_tokens = sum(wire.block_tokens(b) for b in content) or 1
        message_id = "msg_01" + secrets.token_hex(11)
        usage = wire.usage_json(cached.usage_fields(), out_tokens, turn.server_tool_use)
        message = wire.message_json(message_id, body["model"], content, turn, usage, cut, sequence)
        record.response = message
        if message["stop_reason"] == "refusal":
            self._remember_refusal(body["messages"][-1], content)
        if not body.get("stream"):
            if fault is not None and fault.kind in ("drop", "end", "garbled"):
                self._finish(record, 0, "dropped")
                return False
            if fault is not None and fault.kind == "error_event":
                raise wire.ApiError(529, fault.error_type, fault.message)
            if fault is not None and fault.kind == "slow":
                await asyncio.sleep(fault.delay)
            self._finish(record, 200, "ok")
            await _send_json(writer, 200, message, record.request_id, extra)
            return True
        return await self._stream(message, writer, record, fault, extra)

    async def _stream(
        self,
        message: dict[str, Any],
        writer: asyncio.StreamWriter,
        record: RecordedRequest,
        fault: Fault | None,
        extra: Mapping[str, str],
    ) -> bool:
        headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "transfer-encoding": "chunked",
            **extra,
        }
        writer.write(_head(200, record.request_id, headers))
        delay = fault.delay if fault is not None and fault.kind == "slow" else self.delta_delay
        cut = (
            fault.after_events
            if fault is not None and fault.kind in ("error_event", "drop", "end", "garbled")
            else None
        )
        tool_json = fault.raw if fault is not None and fault.kind == "tool_json" else None
        try:
            for sent, (event, data) in enumerate(wire.stream_events(message, self.chunk_size, tool_json)):
                if cut is not None and sent >= cut:
                    break
                if delay:
                    await asyncio.sleep(delay)
                writer.write(_chunk(wire.sse(event, data)))
                await writer.drain()
            if fault is not None and fault.kind == "drop":
                self._finish(record, 200, "dropped")
                return False
            outcome = "ok"
            if fault is not None and fault.kind == "error_event":
                error = {"type": "error", "error": {"type": fault.error_type, "message": fault.message}}
                error["request_id"] = record.request_id
                writer.write(_chunk(wire.sse("error", error)))
                outcome = "error_event"
            elif fault is not None and fault.kind == "end":
                outcome = "ended_early"  # the last chunk below, as if the answer were whole
            elif fault is not None and fault.kind == "garbled":
                writer.write(_chunk(b"event: content_block_delta\ndata: {not json\n\n"))
                outcome = "garbled"
            self._finish(record, 200, outcome)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except ConnectionError:
            if not record.outcome:
                self._finish(record, 200, "client_closed")
            return False
        return True

    def _control(self, method: str, path: str, body: Any) -> dict[str, Any]:
        if path == "/_control/requests" and method == "GET":
            with self._lock:
                records = [r.to_json() for r in self._state.requests if r.path.startswith("/v1/")]
            return {"count": len(records), "requests": records}
        if method != "POST":
            raise wire.ApiError(405, "invalid_request_error", f"Method {method} not allowed")
        body = body or {}
        if path == "/_control/faults":
            faults = [Fault.from_json(f) if f is not None else None for f in body.get("faults", [])]
            self.inject(*faults)
            return {"queued": len(self._state.faults)}
        if path == "/_control/account_error":
            fault = body.get("fault")
            try:
                self.set_account_error(None if fault is None else Fault.from_json(fault))
            except (TypeError, ValueError) as exc:
                raise wire.invalid(str(exc)) from exc
            return {"account_error": fault}
        if path == "/_control/scenario":
            try:
                self.set_scenario(str(body.get("scenario")))
            except ValueError as exc:
                raise wire.invalid(str(exc)) from exc
            return {"scenario": self._state.scenario_name}
        if path == "/_control/reset":
            self.reset()
            return {"reset": True}
        raise wire.ApiError(404, "not_found_error", f"Not found: {method} {path}")


async def _read_request(reader: asyncio.StreamReader) -> _HttpRequest | None:
    line = await reader.readline()
    if not line:
        return None
    method, target, _version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readline()
                break
            body += await reader.readexactly(size)
            await reader.readline()
            if len(body) > MAX_BODY:
                raise ValueError("request body too large")
    else:
        length = int(headers.get("content-length", "0"))
        if length > MAX_BODY:
            raise ValueError("request body too large")
        body = await reader.readexactly(length)
    return _HttpRequest(method, target, headers, body)


def _head(status: int, request_id: str, headers: Mapping[str, str]) -> bytes:
    """The status line and headers; a `date` on every response, as the API sends (one that
    goes with a rate limit's reset is given in `headers`, read from the same clock)."""
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", f"request-id: {request_id}"]
    if "date" not in headers:
        lines.append(f"date: {formatdate(usegmt=True)}")
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def _send_json(
    writer: asyncio.StreamWriter,
    status: int,
    payload: Any,
    request_id: str,
    extra: Mapping[str, str] | None = None,
) -> None:
    data = json.dumps(payload, ensure_ascii=False).encode()
    headers = {"content-type": "application/json", "content-length": str(len(data)), **(extra or {})}
    writer.write(_head(status, request_id, headers) + data)
    await writer.drain()


def serve_forever(
    scenario: str, host: str, port: int, secret: bytes | None = None, delta_delay: float = 0.0
) -> int:
    """`runrow fake-model`: serve in this process until SIGINT/SIGTERM; prints the base URL."""
    import signal

    fake = FakeModel(scenario, host=host, port=port, secret=secret or DEFAULT_SECRET, delta_delay=delta_delay)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)

        def ready(server: FakeModel) -> None:
            print(server.base_url, flush=True)

        with contextlib.suppress(asyncio.CancelledError):
            await fake.serve(on_ready=ready)

    asyncio.run(main())
    return 0
