"""One streamed model turn on `anthropic.AsyncAnthropic`: request, deltas to the journal, the
final message, and the classification of what went wrong.

What the request is built from: model, system prompt and tool definitions from the run's pinned
prompt (`ClaimedRun`), never from worker configuration; request parameters from the run's
metadata (pinned at enqueue), see `REQUEST_PARAMS` and `DEFAULT_MAX_TOKENS`; the prompt-cache
breakpoints from `metadata.prompt_cache` (pyworker/agent/prompt_cache.py).

Where the client points: `ANTHROPIC_BASE_URL` (else the SDK's default, the real API) and
`ANTHROPIC_API_KEY`; worker config `anthropic_base_url` / `anthropic_max_retries` override.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anthropic
from anthropic.resources.messages import AsyncMessages

from pyworker.agent.prompt_cache import add_breakpoints, cache_mode
from pyworker.db.api import ClaimedRun
from pyworker.worker import metrics, tracing
from pyworker.worker.journal import RunJournal

try:  # the HTTP library the SDK is built on (httpx2 in this environment, httpx upstream)
    import httpx2 as _http
except ImportError:  # pragma: no cover
    import httpx as _http  # type: ignore[no-redef]

DEFAULT_MAX_TOKENS = 4096
# Request parameters a run may pin in its metadata (enqueue_run(metadata => ...)).
REQUEST_PARAMS = ("max_tokens", "thinking", "temperature", "top_p", "top_k", "stop_sequences", "tool_choice")
DEFAULT_MAX_RETRIES = 2
# tool_choice types that make the model call a tool (tool_choice_for sends them once a turn).
FORCING_TOOL_CHOICES = ("any", "tool")
# The parameters this SDK's messages.stream() names. A pinned one it does not name goes in the
# request body as is (extra_body), so the API decides: anthropic 2.17's stream() no longer takes
# temperature, top_p or top_k, and passing them as keywords raised TypeError before any request,
# on every attempt. A model that does not take one answers 400, which fails the run once.
STREAM_PARAMS = frozenset(inspect.signature(AsyncMessages.stream).parameters)

DELTA_EVENTS = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}


class TurnFailed(Exception):
    """The model call of this step failed. `retryable`: a transient failure (the attempt ends and
    the run is released: requeued while attempts are left); otherwise the run fails."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        request_id: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
        key_error: bool = False,
        detail: str | None = None,
    ):
        super().__init__(message)
        self.retryable = retryable
        # About the API key or account, not this run (see `is_key_error`): the whole fleet's
        # requests fail alike until an operator fixes the key or the account.
        self.key_error = key_error
        self.detail = detail  # the API's own `type: message`, when it answered with one
        self.request_id = request_id
        self.status = status  # the HTTP status, when the API answered with one
        self.retry_after = retry_after  # seconds, from retry-after-ms / retry-after
        self.usage: dict[str, Any] | None = None  # what the response billed before it failed
        # The refusal's HTTP headers (its rate-limit headers among them), when the API answered
        # with an error status; None for a failure mid-stream (its headers were read at its start).
        self.headers: Mapping[str, str] | None = None


class TurnCancelled(Exception):
    """A stop arrived mid-stream; `partial_text` is what had been streamed (and journaled)."""

    def __init__(self, partial_text: str, usage: dict[str, Any] | None = None):
        super().__init__("cancelled mid-stream")
        self.partial_text = partial_text
        self.usage = usage  # what the response billed before it was closed


@dataclass
class Received:
    """What a response had delivered so far: its text, and its usage as message_start and the
    message_delta events reported it (cumulative). None before message_start: the API billed
    nothing. A response that fails or is stopped mid-stream was billed for this much."""

    text: list[str] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    streamed: int = 0  # characters of every delta (text, thinking, tool input JSON) received

    def started(self, usage: Any) -> None:
        self.usage = _reported(usage)

    def grew(self, usage: Any) -> None:
        if self.usage is not None and usage is not None:
            self.usage.update(_reported(usage))

    def billed(self) -> dict[str, Any] | None:
        """usage, for a response cut before it ended: the API reports output_tokens at
        message_start (a token or so) and then only in message_delta, which a long answer
        sends at its end, so a stream stopped, failed or drained mid-answer was paid for
        almost none of the output it had streamed (a person stopping long answers spent
        nothing of the budget). output_tokens is the larger of what was reported and the
        characters streamed at 3 a token (prose runs about 4, code and other languages fewer:
        it errs high, as a budget must)."""
        if self.usage is None:
            return None
        estimate = -(-self.streamed // CHARS_PER_OUTPUT_TOKEN)
        return {**self.usage, "output_tokens": max(int(self.usage.get("output_tokens") or 0), estimate)}


CHARS_PER_OUTPUT_TOKEN = 3


def _reported(usage: Any) -> dict[str, Any]:
    return {k: v for k, v in usage.to_dict(mode="json").items() if v is not None}


@dataclass(frozen=True)
class ModelTurn:
    message: dict[str, Any]  # final_message.to_dict(mode="json"): what came off the wire
    content_text: str  # json.dumps(message["content"]): the step payload, serialized once
    stop_reason: str | None
    usage: dict[str, Any] | None
    request_id: str | None

    @property
    def text(self) -> str:
        return "".join(b.get("text", "") for b in self.message.get("content", []) if b.get("type") == "text")


# Per event loop (a client's connection pool belongs to the loop it was used on), per endpoint.
_clients: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[Any, ...], anthropic.AsyncAnthropic]
] = weakref.WeakKeyDictionary()


class FleetClient(anthropic.AsyncAnthropic):
    """The SDK client without its in-attempt retries of a 429. Those retries are each worker
    meeting the limit alone; with fleet limits on, the 429 is reported to the database at once
    and every worker of the key waits out the block (pyworker/agent/limits.py)."""

    def _should_retry(self, response: Any) -> bool:
        if response.status_code == 429:
            return False
        return super()._should_retry(response)


def client_for(config: dict[str, Any]) -> anthropic.AsyncAnthropic:
    """One client (one connection pool) per event loop and endpoint."""
    base_url = config.get("anthropic_base_url") or os.environ.get("ANTHROPIC_BASE_URL") or None
    api_key = config.get("anthropic_api_key") or os.environ.get("ANTHROPIC_API_KEY") or None
    retries = int(
        config.get("anthropic_max_retries", os.environ.get("RUNROW_MAX_RETRIES", DEFAULT_MAX_RETRIES))
    )
    fleet = bool(config.get("fleet_limits", True))
    key = (base_url, api_key, retries, fleet)
    clients = _clients.setdefault(asyncio.get_running_loop(), {})
    client = clients.get(key)
    if client is None:
        kind = FleetClient if fleet else anthropic.AsyncAnthropic
        client = kind(
            base_url=base_url,
            api_key=api_key or "no-key-set",
            max_retries=retries,
            # The SDK's own client and defaults, plus a hook that counts the 429/529s it retries.
            http_client=anthropic.DefaultAsyncHttpxClient(
                event_hooks={"response": [metrics.on_model_response]}
            ),
        )
        clients[key] = client
    return client


def request_params(run: ClaimedRun, messages: list[dict[str, Any]]) -> dict[str, Any]:
    meta = run.metadata or {}
    params: dict[str, Any] = {"model": run.model, "messages": messages, "max_tokens": DEFAULT_MAX_TOKENS}
    extra: dict[str, Any] = {}
    for name in REQUEST_PARAMS:
        if meta.get(name) is not None:
            value = tool_choice_for(meta[name], messages) if name == "tool_choice" else meta[name]
            (params if name in STREAM_PARAMS else extra)[name] = value
    if extra:
        params["extra_body"] = extra
    if run.system_prompt:
        params["system"] = run.system_prompt
    if run.tools:
        params["tools"] = run.tools
    return add_breakpoints(params, cache_mode(meta))


def tool_choice_for(pinned: Any, messages: list[dict[str, Any]]) -> Any:
    """The tool_choice to send with `messages`: a pinned forcing one (`any`, `tool`) only on the
    request that answers the person's own message; on the later requests of the turn (tool
    results, a paused turn sent back) `{"type": "auto"}`, with the pinned
    `disable_parallel_tool_use` kept. A forcing choice makes the model call a tool on every
    request it is sent with, so sent with all of them the model could never answer: the loop
    never ended, and each request carried the whole growing history. Decided from the messages
    being sent, not from what this attempt did, so a resumed attempt decides the same."""
    if not isinstance(pinned, dict) or pinned.get("type") not in FORCING_TOOL_CHOICES:
        return pinned
    if answers_the_person(messages):
        return pinned
    auto: dict[str, Any] = {"type": "auto"}
    if "disable_parallel_tool_use" in pinned:
        auto["disable_parallel_tool_use"] = pinned["disable_parallel_tool_use"]
    return auto


def answers_the_person(messages: list[dict[str, Any]]) -> bool:
    """The request ends with what a person wrote: a user message whose last block is not a tool
    result (tool results of an earlier turn may come before it in the same message)."""
    if not messages or messages[-1].get("role") != "user":
        return False
    content = messages[-1].get("content")
    if not isinstance(content, list) or not content:
        return True
    last = content[-1]
    return not (isinstance(last, dict) and last.get("type") == "tool_result")


OnHeaders = Callable[[Mapping[str, str]], Awaitable[None]]


async def stream_turn(
    client: anthropic.AsyncAnthropic,
    params: dict[str, Any],
    journal: RunJournal,
    cancel: asyncio.Event,
    received: Received | None = None,
    on_headers: OnHeaders | None = None,
) -> ModelTurn:
    """Stream one response, journaling every delta. Returns when the message is complete; raises
    TurnCancelled (the stream is closed at once), TurnFailed, or RunLost from the journal.
    `received`: the caller's, when it must know what a response cut by the cancellation of its
    own task was billed (no exception of ours carries that usage out). `on_headers`: awaited
    with the response's headers once they arrive, before its body is read (the rate-limit
    headers, pyworker/agent/limits.py after_headers)."""
    received = Received() if received is None else received
    consumer = asyncio.create_task(_consume(client, params, journal, received, on_headers))
    stopper = asyncio.create_task(cancel.wait())
    try:
        await asyncio.wait({consumer, stopper}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # our own task is being cancelled (run lost, drain): stop the stream
        # Counted here only if cut here: a response that completed (or failed) in the same turn
        # of the event loop was counted by _consume already.
        cut = consumer.cancel()
        with contextlib.suppress(BaseException):
            await consumer
        if cut:
            metrics.model_usage(str(params.get("model")), received.billed())
        raise
    finally:
        stopper.cancel()
    if not consumer.done():
        # Closing the stream (the context manager's exit on cancellation) drops the connection, so
        # the model stops generating and nothing more is billed.
        consumer.cancel()
        with contextlib.suppress(BaseException):
            await consumer
        billed = received.billed()  # the stream is closed: what was received is final
        metrics.model_usage(str(params.get("model")), billed)
        raise TurnCancelled("".join(received.text), billed)
    return consumer.result()


async def _consume(
    client: anthropic.AsyncAnthropic,
    params: dict[str, Any],
    journal: RunJournal,
    received: Received,
    on_headers: OnHeaders | None,
) -> ModelTurn:
    model = str(params.get("model"))
    with metrics.model_request(model), tracing.model_request(model) as span:
        try:
            turn = await _consume_stream(client, params, journal, received, on_headers)
        except TurnFailed as failed:
            failed.usage = received.billed()
            metrics.model_usage(model, failed.usage)
            tracing.request_failed(span, failed.request_id, str(failed))
            raise
        metrics.model_usage(model, turn.usage)
        tracing.model_turn(span, turn.message.get("model"), turn.usage, turn.request_id, turn.stop_reason)
        return turn


async def _consume_stream(
    client: anthropic.AsyncAnthropic,
    params: dict[str, Any],
    journal: RunJournal,
    received: Received,
    on_headers: OnHeaders | None,
) -> ModelTurn:
    request_id: str | None = None
    started = False  # the response's headers are in: a failure from here on is mid-response
    stopped = False  # message_stop arrived: the response is whole
    reading: Any = None  # the SDK's stream, once open: what it had parsed when it could read no more
    try:
        async with client.messages.stream(**params) as stream:
            started = True
            reading = stream
            request_id = stream.request_id
            if on_headers is not None:
                await on_headers(stream.response.headers)
            events = aiter(stream)
            while (event := await _read(anext(events, None))) is not None:
                if event.type == "message_stop":
                    stopped = True
                    continue
                if event.type == "message_start":
                    received.started(event.message.usage)
                    continue
                if event.type == "message_delta":
                    received.grew(event.usage)
                    continue
                if event.type != "content_block_delta":
                    continue
                delta = event.delta
                field = DELTA_EVENTS.get(delta.type)
                if field is None:
                    continue  # signature_delta, citations_delta: part of the final message
                value = getattr(delta, field)
                received.streamed += len(value)
                if delta.type == "text_delta":
                    received.text.append(value)
                await journal.emit({"type": delta.type, "index": event.index, field: value})
            if not stopped:
                # Checked before get_final_message: with no message_start at all the SDK has no
                # snapshot and fails an assertion of its own (the run was released as "handler
                # raised: AssertionError", with no backoff).
                raise _ended_early(request_id)
            final = await _read(stream.get_final_message())
    except _Unreadable as unreadable:
        exc = unreadable.__cause__
        assert exc is not None
        raise _unreadable(exc, reading, request_id) from exc
    except anthropic.APIStatusError as exc:
        raise _status_failure(exc, params.get("model")) from exc
    except anthropic.APIConnectionError as exc:  # includes timeouts, after the SDK's retries
        # Since anthropic 2.17 the SDK wraps a read that fails mid-body in APIConnectionError too
        # (earlier versions let the transport's error through, below): the API was reached and
        # answered, and the message should say what broke, as before.
        # (A body that cannot be decoded, httpx's DecodingError, is wrapped the same way.)
        if started and exc.__cause__ is not None:
            raise _broken_mid_response(exc.__cause__, request_id) from exc
        raise TurnFailed(f"model API unreachable: {exc}", retryable=True, request_id=request_id) from exc
    except _http.TransportError as exc:  # a connection cut mid-stream; the SDK does not retry it
        raise _broken_mid_response(exc, request_id) from exc
    if final.stop_reason is None:
        # A body that ends cleanly before message_stop (a proxy or load balancer closing the SSE
        # response) raises nothing in the SDK: get_final_message returns the snapshot so far,
        # stop_reason None, a tool_use's input as far as it got. Committed, it failed the run for
        # good, and a resume ran the tool with that half input. It is a transient failure of this
        # call, like a dropped connection: nothing stored, the usage paid, the call made again.
        raise _ended_early(request_id)
    message = final.to_dict(mode="json")
    return ModelTurn(
        message=message,
        content_text=json.dumps(message.get("content", []), ensure_ascii=False),
        stop_reason=message.get("stop_reason"),
        usage=message.get("usage"),
        request_id=request_id,
    )


class _Unreadable(Exception):
    """The SDK raised, reading a response, what is none of its API or transport errors (the
    cause): a tool input the model streamed that does not parse, an event that is not JSON.
    Raised only from the SDK's own calls (`_read`), so what the loop raises between them (the
    journal's RunLost, a JournalError) is never taken for it."""


T = TypeVar("T")


async def _read(step: Awaitable[T]) -> T:
    try:
        return await step
    except (anthropic.APIStatusError, anthropic.APIConnectionError, _http.TransportError):
        raise  # classified by _consume_stream
    except Exception as exc:
        raise _Unreadable from exc


# How the SDK words a tool input the model streamed that does not parse (its ValueError, raised
# as the delta that breaks it arrives), and where in its message that input starts.
TOOL_JSON_ERROR = "Unable to parse tool parameter JSON from model"
TOOL_JSON_AT = ". JSON: "
SHOWN_INPUT = 160  # characters of such an input the run's error shows, half from each end


def _unreadable(exc: BaseException, stream: Any, request_id: str | None) -> TurnFailed:
    """What a response the SDK could not read means for the run. Escaped unclassified, it was
    "handler raised": released with no backoff and its billed usage never counted (the agent
    audit: a tenant's budget went unpaid by an answer per attempt).

    A tool input that does not parse is the model's answer, sampled: asked again, it usually
    answers valid JSON. So it is released with a backoff, spending an attempt, the error saying
    which tool and what input: max_attempts is the operator's bound on what retries cost (the
    default 1 fails it once, paid once). Failed at once, a run with attempts left never got the
    second answer it was configured to pay for. Anything else (an event that is not JSON,
    events out of order) is the stream's fault, not the request's: a transient failure too."""
    message = str(exc)
    if isinstance(exc, ValueError) and message.startswith(TOOL_JSON_ERROR):
        raw = message.split(TOOL_JSON_AT, 1)[1] if TOOL_JSON_AT in message else ""
        why = exc.__cause__ if exc.__cause__ is not None else "not JSON"
        return TurnFailed(
            f"the model's input for the tool {_tool_of(stream)} is not valid JSON ({why}): "
            f"{_shortened(raw)}; the response is not stored",
            retryable=True,
            request_id=request_id,
        )
    return TurnFailed(
        f"model stream unreadable mid-response: {type(exc).__name__}: {_shortened(message)}",
        retryable=True,
        request_id=request_id,
    )


def _tool_of(stream: Any) -> str:
    """The name of the tool whose input was streaming: the snapshot's last block."""
    try:
        return str(stream.current_message_snapshot.content[-1].name)
    except (AttributeError, IndexError, AssertionError):
        return "(unknown)"


def _shortened(text: str) -> str:
    if len(text) <= SHOWN_INPUT:
        return text
    half = SHOWN_INPUT // 2
    return f"{text[:half]}…{text[-half:]}"


def _broken_mid_response(exc: BaseException, request_id: str | None) -> TurnFailed:
    message = f"model stream broken mid-response: {type(exc).__name__}: {exc}"
    return TurnFailed(message, retryable=True, request_id=request_id)


def _ended_early(request_id: str | None) -> TurnFailed:
    message = "model stream ended before message_stop: the response is incomplete (not stored)"
    return TurnFailed(message, retryable=True, request_id=request_id)


# What to do about a conversation grown past the model's window: runrow keeps history whole
# (no truncation), so the way on is a conversation that holds less.
TOO_LONG_REMEDY = (
    "start a new conversation, or fork_run this one at an earlier step (runrow keeps a "
    "conversation's history whole; it does not truncate or summarise it)"
)


def _status_failure(exc: anthropic.APIStatusError, model: str | None = None) -> TurnFailed:
    status = exc.status_code
    request_id = getattr(exc, "request_id", None)
    detail = _error_message(exc)
    if is_key_error(exc, model):
        return TurnFailed(
            f"model API key or account error: HTTP {status}: {detail} (the run waits for the key "
            'to work: fix the API key or the account; README "API key and account errors")',
            retryable=True,
            request_id=request_id,
            status=status,
            key_error=True,
            detail=detail,
        )
    if status in (400, 413) and ("prompt is too long" in detail or "request_too_large" in detail):
        # Every later turn of the conversation sends the same history and fails the same way
        # (the long-conversation audit): say so, and what to do, rather than "refused".
        return TurnFailed(
            f"model API refused the request: HTTP {status}: {detail}: the conversation's history no "
            f"longer fits the model's context window; {TOO_LONG_REMEDY}",
            retryable=False,
            request_id=request_id,
            status=status,
        )
    if status == 200:
        return _error_event_failure(exc, detail, request_id)
    retryable = status in (408, 409, 429) or status >= 500
    what = "model API error (retries exhausted)" if retryable else "model API refused the request"
    failed = TurnFailed(
        f"{what}: HTTP {status}: {detail}",
        retryable=retryable,
        request_id=request_id,
        status=status,
        retry_after=retry_after_of(exc),
    )
    failed.headers = getattr(getattr(exc, "response", None), "headers", None)
    return failed


# The `error` events mid-stream that may pass: the API's own trouble, not the request's. No type
# at all (a body that is not the API's JSON) counts as one too. Any other type (an
# invalid_request_error, a not_found_error) recurs on every attempt: retried, each attempt was
# sent and paid for again.
TRANSIENT_ERROR_EVENTS = (None, "overloaded_error", "api_error", "timeout_error")


def _error_event_failure(exc: anthropic.APIStatusError, detail: str, request_id: str | None) -> TurnFailed:
    """An `error` event after the stream started (a 200): the step failed. A rate_limit_error is
    the API's 429, sent late: reported and waited out like one (status 429, limits.after_failure)."""
    error_type, _ = _error_fields(exc)
    message = f"model stream error mid-response: {detail}"
    if error_type == "rate_limit_error":
        return TurnFailed(message, retryable=True, request_id=request_id, status=429)
    return TurnFailed(message, retryable=error_type in TRANSIENT_ERROR_EVENTS, request_id=request_id)


# Answers about the API key or the account every request of the fleet sends, not about one
# run's request. 401: the key (missing, invalid, revoked, expired). 402 / billing_error: the
# account's billing. 403 permission_error: the key or the organisation (a key without access to
# the API, a disabled organisation, "access to models has been suspended"), unless its message
# names the run's own model: a model the organisation may not use is that run's request, and
# fails it once, as a 404 for an unknown model does. Without the run's model at hand, any
# mention of a model counts (the word alone sent every run of a suspended organisation to fail).
# 400 invalid_request_error "Your credit balance is too low to access the Anthropic API": the
# account, though sent as a 400. Every other 400 (the request's own content) stays the run's.
ACCOUNT_MESSAGES = ("credit balance",)
PaymentRequired = getattr(anthropic, "PaymentRequiredError", None)


def is_key_error(exc: anthropic.APIStatusError, model: str | None = None) -> bool:
    error_type, message = _error_fields(exc)
    status = exc.status_code
    lowered = message.lower()
    if (
        status == 401
        or error_type == "authentication_error"
        or isinstance(exc, anthropic.AuthenticationError)
    ):
        return True
    if status == 402 or error_type == "billing_error":
        return True
    if PaymentRequired is not None and isinstance(exc, PaymentRequired):
        return True
    if isinstance(exc, anthropic.PermissionDeniedError) or status == 403 or error_type == "permission_error":
        return (model.lower() if model else "model") not in lowered
    return status == 400 and any(m in lowered for m in ACCOUNT_MESSAGES)


def may_be_own_request(status: int | None) -> bool:
    """Whether a key error (is_key_error) may be about the run's own request after all: a 403
    not naming the model may refuse a beta, a tool type or a file the organisation may not use,
    in words no list keeps. The database tells it apart (report_key_error): refused again after
    the key answered another request since, the run fails once. A 401, a 402, a "credit
    balance" never is: repeated after an answer, the key broke again (a rotation half-way
    through the fleet, the credit spent again)."""
    return status == 403


def retry_after_of(exc: anthropic.APIStatusError) -> float | None:
    """The wait the API asked for, in seconds (retry-after-ms, else retry-after in seconds);
    None when it gave none or one that is not a positive number (an HTTP date is ignored)."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw) * scale
        except ValueError:
            continue
        if 0 < value < float("inf"):
            return value
    return None


def _error_message(exc: anthropic.APIStatusError) -> str:
    error_type, message = _error_fields(exc)
    return f"{error_type}: {message}" if error_type else message


def _error_fields(exc: anthropic.APIStatusError) -> tuple[str | None, str]:
    """The error body's `type` and `message` (type None when the body has no message)."""
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error") if isinstance(body.get("error"), dict) else body
        if isinstance(error, dict) and error.get("message"):
            return str(error.get("type", "error")), str(error["message"])
    return None, str(exc.message)
