"""Runs: enqueue a turn (202), read a run, stream its events, stop a conversation, cancel a run.

A run or conversation of another user answers 404 exactly as an unknown id does.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any, Protocol, TypeVar
from urllib.parse import quote
from uuid import UUID

import psycopg
from psycopg import AsyncConnection
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pyworker.db import api, nul
from pyworker.db.printable import first_hidden
from pyworker.db.tail import CursorPastEnd
from pyworker.http import queries
from pyworker.http.bodies import (
    check_json,
    field,
    integer,
    path_uuid,
    read_json_object,
    read_no_fields,
    reject_unknown,
    text,
)
from pyworker.http.config import OPT_IN_FIELDS, USER_FIELDS
from pyworker.http.context import Services, authenticated
from pyworker.http.errors import ApiError, not_found
from pyworker.http.replica import open_stream, watched
from pyworker.http.spans import annotate
from pyworker.http.sse import EventStreamResponse, event_frames
from pyworker.http.webhook_targets import refuse_non_public
from pyworker.worker import tracing

ENQUEUE_FIELDS = USER_FIELDS | set(OPT_IN_FIELDS)
log = logging.getLogger("runrow.http")

# The claim order's levers over other tenants: a user who could set them would claim ahead of
# everyone (priority), spend another tenant's share (fairness_key) or fill another workload's
# cap (concurrency_key). Over HTTP a run's tenant is its authenticated user (enqueue_run's
# default) at the default priority; operators set these through SQL or `runrow enqueue`.
OPERATOR_FIELDS = ("priority", "fairness_key", "concurrency_key")
MAX_START_IN = 366 * 86400  # enqueue_run's start_in is at most 366 days
IF_ACTIVE = ("enqueue", "reject", "interrupt")
MAX_IDEMPOTENCY_KEY = 200
MAX_ATTEMPTS = 100  # enqueue_run's range is 1..100
# W3C Trace Context, as enqueue_run checks metadata.traceparent (version ff and all-zero ids refused).
TRACEPARENT = re.compile(r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
CURSOR = re.compile(r"[0-9]{1,19}")  # ASCII digits only (str.isdigit also says yes to "²")
MAX_SEQ = 2**63 - 1  # read_events' after_seq is a bigint


def _refuse_operator_fields(body: dict[str, Any]) -> None:
    for name in OPERATOR_FIELDS:
        if name in body:
            raise ApiError(
                403,
                "forbidden_field",
                f"{name} is set by the operator, not per request: over HTTP a run belongs to its "
                "authenticated user's fair share at the default priority (operators use enqueue_run "
                f"over SQL or `runrow enqueue --{name.replace('_', '-')}`)",
            )


def _refuse_fields_not_opted_in(body: dict[str, Any], user_may_set: frozenset[str]) -> None:
    for name in OPT_IN_FIELDS:
        if name in body and name not in user_may_set:
            if body[name] is None:
                # null asks for the default, which is the operator's: not an override.
                del body[name]
                continue
            raise ApiError(
                403,
                "forbidden_field",
                f"{name} is the operator's to set on this service: its runs take the operator's "
                f"{name} (to let users set it, the operator starts runrow serve with "
                f"--user-may-set {name})",
            )


def _budget(body: dict[str, Any], name: str, what: str, kind: Any, most: int) -> Any:
    """A run's own budget: a user may always set one, since it only limits the run (a run
    started over HTTP had no limit but its tenant's, an agent in a tool loop spending on)."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, kind) or not 0 < value <= most:
        # An int bound, printed as one: `{2**63 - 1:.0f}` went through a float, 9223372036854775808.
        raise ApiError(400, "invalid_request", f"{name} must be {what}, more than 0 and at most {most}")
    return value


def _usd(value: float | None) -> Decimal | None:
    return None if value is None else Decimal(str(value))


def _fleet_options(body: dict[str, Any]) -> api.FleetOptions:
    """The fleet fields an API user may set (start_in, the run's budgets, webhook_url where the
    operator lets them), each a 400 naming it when bad, never a database error."""
    start_in = body.get("start_in")
    if start_in is not None and (
        isinstance(start_in, bool)
        or not isinstance(start_in, int | float)
        or not 0 < start_in <= MAX_START_IN
    ):
        raise ApiError(
            400,
            "invalid_request",
            f"start_in must be a number of seconds, more than 0 and at most {MAX_START_IN}",
        )
    return api.FleetOptions(
        start_in=None if start_in is None else timedelta(seconds=start_in),
        token_budget=_budget(body, "token_budget", "a number of tokens", int, 2**63 - 1),
        cost_budget=_usd(_budget(body, "cost_budget", "a number of USD", int | float, 10**15)),
        # The URL's rules are enqueue_run's (its 22023 names webhook_url and becomes a 400).
        webhook_url=text(body, "webhook_url", "an http:// or https:// URL"),
    )


async def enqueue(request: Request, svc: Services, user: str) -> Response:
    conversation_id = path_uuid(request, "conversation_id", "conversation")
    body = await read_json_object(request, svc.config.max_body_bytes)
    _refuse_operator_fields(body)
    reject_unknown(body, ENQUEUE_FIELDS)
    _refuse_fields_not_opted_in(body, svc.config.user_may_set)
    if body.get("content") is None:
        raise ApiError(400, "invalid_request", "content is required: a string or an array of content blocks")
    content = field(body, "content", (str, list), "a string or an array of content blocks")
    check_json(content, "content")
    model = text(body, "model", "a model name")
    if model is None:
        model = svc.config.model  # an empty name is not "the default": enqueue_run refuses it
    system = text(body, "system", "a string")
    tools = field(body, "tools", list, "an array of tool definitions")
    check_json(tools, "tools")
    max_attempts = integer(body, "max_attempts", 1, MAX_ATTEMPTS)
    metadata = field(body, "metadata", dict, "an object")
    check_json(metadata, "metadata")
    metadata = _with_traceparent(request, metadata)
    if_active = text(body, "if_active", "one of " + ", ".join(IF_ACTIVE))
    if if_active is None:
        if_active = "enqueue"
    if if_active not in IF_ACTIVE:
        raise ApiError(
            400, "invalid_request", f"if_active must be one of {', '.join(IF_ACTIVE)}, not {if_active!r}"
        )
    fleet = _fleet_options(body)
    if fleet.webhook_url is not None and not svc.config.allow_private_webhooks:
        await refuse_non_public(fleet.webhook_url, svc.config.webhook_allow_networks)
    key = _idempotency_key(request, user)
    try:
        async with svc.pool.connection() as conn:
            run = await api.enqueue_run(
                conn,
                conversation_id,
                content,
                model,
                user_id=user,
                # The server's defaults are pinned on the run now, not resolved by a worker later.
                system_prompt=system if "system" in body else svc.config.system_prompt,
                tools=tools if "tools" in body and tools is not None else svc.config.tools,
                max_attempts=svc.config.max_attempts if max_attempts is None else max_attempts,
                idempotency_key=key,
                if_active=if_active,
                metadata=metadata,
                fleet=fleet,
            )
    except psycopg.errors.InsufficientPrivilege:
        raise not_found("conversation", conversation_id) from None
    except psycopg.errors.ObjectNotInPrerequisiteState as exc:
        raise ApiError(409, "conversation_busy", exc.diag.message_primary or str(exc)) from None
    except psycopg.errors.UniqueViolation as exc:
        if exc.diag.constraint_name != "agent_run_idempotency_key" or key is None:
            raise
        # As the IETF idempotency-key draft says: a reused key with another request is a 422.
        raise ApiError(
            422,
            "idempotency_key_reused",
            f"Idempotency-Key {key.partition(':')[2]!r} was already used for a different "
            "request (another conversation, content or option); repeat that request exactly to get "
            "its run, or send this one with a new key",
        ) from None
    payload = {
        "run_id": str(run.run_id),
        "status": run.status,
        "conversation_id": str(conversation_id),
        "created": run.created,
    }
    # A replayed Idempotency-Key answers 200 with the first run; a new run 202 Accepted.
    return JSONResponse(
        payload, status_code=202 if run.created else 200, headers={"Location": f"/runs/{run.run_id}"}
    )


def _with_traceparent(request: Request, metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """The run's parent span (metadata.traceparent), whose trace every attempt continues: one
    the caller put in metadata, as given; else this request's server span while one is
    recording (pyworker/http/spans.py), itself the child of the caller's `traceparent` header,
    so caller → request → attempts is one trace; else that header, as sent."""
    value = _header_traceparent(request)
    given = (metadata or {}).get("traceparent")
    if given is not None and value is not None and given != value:
        raise ApiError(
            400, "invalid_request", "traceparent header and metadata.traceparent differ: send one of them"
        )
    if given is not None:
        return metadata
    value = tracing.current_traceparent() or value
    return metadata if value is None else {**(metadata or {}), "traceparent": value}


def _header_traceparent(request: Request) -> str | None:
    raw = request.headers.get("traceparent")
    if raw is None:
        return None
    value = _traceparent(raw.strip())
    if value is None:
        # W3C Trace Context: a receiver that cannot parse the header ignores it (and starts a
        # trace of its own); refusing the request over it (400) lost the caller's run.
        log.debug("ignoring a traceparent header that is not W3C trace context: %r", raw[:100])
    return value


def _traceparent(value: str) -> str | None:
    """The header as enqueue_run stores it, or None when it is not W3C trace context. A later
    version (not 00) is read from its first 55 characters, as the spec says, if a dash or
    nothing follows them; version 00 has exactly those."""
    if len(value) > 55 and not value.startswith("00") and value[55] == "-":
        value = value[:55]
    return value if TRACEPARENT.fullmatch(value) else None


def _idempotency_key(request: Request, user: str) -> str | None:
    header = request.headers.get("idempotency-key")
    if header is None:
        return None
    # Starlette decodes header values as latin-1: a UTF-8 key arrived as mojibake, so "é" was
    # stored as "Ã©" and a U+202E was refused as a C1 control at a shifted position.
    try:
        raw = header.encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_request", "Idempotency-Key must be UTF-8 text") from None
    if not raw or len(raw) > MAX_IDEMPOTENCY_KEY:
        raise ApiError(
            400,
            "invalid_request",
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters, without control characters",
        )
    hidden = first_hidden(raw)
    if hidden is not None:
        # Named by code point and position, not echoed (enqueue_run's rule for identifiers).
        raise ApiError(
            400,
            "invalid_request",
            "Idempotency-Key must not hold control characters (C0, C1 or bidirectional formatting), "
            f"got {hidden}",
        )
    # Namespaced by user so two users' keys never meet; quoting the user id keeps it unambiguous
    # (no ':' in it, so the key the client sent is what follows the first one).
    key = f"{quote(user, safe='')}:{raw}"
    if len(key) > 255:
        raise ApiError(400, "invalid_request", "Idempotency-Key is too long for this user id")
    return key


async def owned_run(svc: Services, run_id: UUID, user: str) -> queries.RunState:
    return await _owned(svc, "run", run_id, user, queries.get_run)


async def owned_conversation(svc: Services, conversation_id: UUID, user: str) -> api.Conversation:
    return await _owned(svc, "conversation", conversation_id, user, api.get_conversation)


class _HasUser(Protocol):
    @property
    def user_id(self) -> str | None: ...


Owned = TypeVar("Owned", bound=_HasUser)


async def _owned(
    svc: Services,
    kind: str,
    key: UUID,
    user: str,
    read: Callable[[AsyncConnection, UUID], Awaitable[Owned]],
) -> Owned:
    """The run or conversation, if it is `user`'s; another user's is as unknown as a missing one (404)."""
    try:
        async with svc.pool.connection() as conn:
            found = await read(conn, key)
    except psycopg.errors.NoDataFound:
        raise not_found(kind, key) from None
    if found.user_id != user:
        raise not_found(kind, key)
    return found


async def get_run(request: Request, svc: Services, user: str) -> Response:
    run = await owned_run(svc, path_uuid(request, "run_id", "run"), user)
    return JSONResponse(run_json(run))


def run_json(run: queries.RunState) -> dict[str, Any]:
    def iso(value: Any) -> str | None:
        return None if value is None else value.isoformat()

    return {
        "run_id": str(run.id),
        "conversation_id": str(run.conversation_id),
        "status": run.status,
        "attempt": run.attempt,
        "max_attempts": run.max_attempts,
        "model": run.model,
        "cancel_requested": run.cancel_requested,
        "retry_of": None if run.retry_of is None else str(run.retry_of),
        "result": nul.decode(run.result),  # JSON carries a NUL; jsonb stored it encoded
        "error": run.error,
        "created_at": iso(run.created_at),
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
    }


async def events(request: Request, svc: Services, user: str) -> Response:
    run_id = path_uuid(request, "run_id", "run")
    cursors = {
        "from": _cursor(request.query_params.get("from"), "from"),
        "Last-Event-ID": _cursor(request.headers.get("last-event-id"), "Last-Event-ID"),
    }
    name, from_seq = max(cursors.items(), key=lambda item: item[1])
    annotate("runrow.stream.from_seq", from_seq)  # a reconnect's span says where it resumed
    await owned_run(svc, run_id, user)
    try:
        seen_the_end, source = await open_stream(svc, run_id, from_seq)
    except CursorPastEnd:
        # Streaming would send keepalives until the run ends and then nothing: the cursor is
        # stale or another run's. A 4xx also stops an EventSource from reconnecting with it.
        raise ApiError(
            400,
            "invalid_request",
            f"{name} {from_seq} is past the end of run {run_id}'s journal, which has no event "
            f"{from_seq}: resume from an id this stream sent, or from 0",
        ) from None
    if seen_the_end:
        # The client has seen the complete: 204 tells an EventSource to stop reconnecting.
        return Response(status_code=204, headers={"Cache-Control": "no-store"})
    frames = event_frames(
        source.pool,
        svc.hub,
        run_id,
        from_seq,
        svc.config.keepalive_seconds,
        svc.config.poll_seconds,
        replica=source.replica,
    )
    if source.replica:
        frames = watched(frames, svc.replica)
    return EventStreamResponse(frames, svc.streams, user, svc.config.max_streams_per_user, svc.stopping)


def _cursor(raw: str | None, name: str) -> int:
    if raw is None or raw.strip() == "":
        return 0
    raw = raw.strip()
    # Up to 2**63 - 1, the largest bigint: a 19-digit seq below it was refused (the HTTP audit).
    if not CURSOR.fullmatch(raw) or int(raw) > MAX_SEQ:
        raise ApiError(
            400,
            "invalid_request",
            f"{name} must be a non-negative integer event seq (at most {MAX_SEQ}), not {raw[:40]!r}",
        )
    return int(raw)


async def stop_conversation(request: Request, svc: Services, user: str) -> Response:
    conversation_id = path_uuid(request, "conversation_id", "conversation")
    await owned_conversation(svc, conversation_id, user)
    await read_no_fields(request, svc.config.max_body_bytes)
    async with svc.pool.connection() as conn:
        stopped = await api.stop_conversation(conn, conversation_id)
    runs = [{"run_id": str(run_id), "action": action} for run_id, action in stopped]
    return JSONResponse({"conversation_id": str(conversation_id), "runs": runs})


async def cancel_run(request: Request, svc: Services, user: str) -> Response:
    run_id = path_uuid(request, "run_id", "run")
    await owned_run(svc, run_id, user)
    await read_no_fields(request, svc.config.max_body_bytes)
    async with svc.pool.connection() as conn:
        action = await api.cancel_run(conn, run_id)
    return JSONResponse({"run_id": str(run_id), "action": action})


async def get_conversation(request: Request, svc: Services, user: str) -> Response:
    conversation = await owned_conversation(svc, path_uuid(request, "conversation_id", "conversation"), user)
    return JSONResponse(
        {
            "conversation_id": str(conversation.id),
            "created_at": conversation.created_at.isoformat(),
            "active_run_id": None if conversation.active_run_id is None else str(conversation.active_run_id),
            "active_status": conversation.active_status,
            "runs": conversation.runs,
        }
    )


routes = [
    Route("/conversations/{conversation_id}/runs", authenticated(enqueue), methods=["POST"]),
    Route("/conversations/{conversation_id}/stop", authenticated(stop_conversation), methods=["POST"]),
    Route("/conversations/{conversation_id}", authenticated(get_conversation), methods=["GET"]),
    Route("/runs/{run_id}", authenticated(get_run), methods=["GET"]),
    Route("/runs/{run_id}/events", authenticated(events, query=frozenset({"from"})), methods=["GET"]),
    Route("/runs/{run_id}/cancel", authenticated(cancel_run), methods=["POST"]),
]
