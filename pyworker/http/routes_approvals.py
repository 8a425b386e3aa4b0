"""Approvals: this user's tool calls waiting on a person, and deciding one.

Lists the runrow.pending_approvals view filtered to the caller: irreversible calls not yet
run (reason needs_approval) and calls that began without a recorded result (uncertain), a page
at a time (pyworker/http/approval_pages.py). A
key of another user's run answers 404, exactly as an unknown key does.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pyworker.db.steps import PendingApproval, resolve_approval
from pyworker.http import approval_pages, queries
from pyworker.http.bodies import field, read_json_object, reject_unknown, text
from pyworker.http.context import Services, authenticated
from pyworker.http.errors import ApiError, not_found


def approval_json(a: PendingApproval) -> dict[str, Any]:
    return {
        "idempotency_key": a.idempotency_key,
        "reason": a.reason,
        "run_id": str(a.run_id),
        "conversation_id": str(a.conversation_id),
        "tool": a.tool,
        "args": a.args,
        "effect": a.effect,
        "tool_use_id": a.tool_use_id,
        "previously_approved": a.previously_approved,
        "previously_decided_by": a.previously_decided_by,
        "started_at": None if a.started_at is None else a.started_at.isoformat(),
        "waiting_since": a.waiting_since.isoformat(),
    }


async def list_approvals(request: Request, svc: Services, user: str) -> Response:
    limit = approval_pages.limit_of(request.query_params.get("limit"))
    after = approval_pages.after_of(request.query_params.get("after"))
    async with svc.pool.connection() as conn:
        # One more than the page: whether another page follows, without a count.
        pending = await queries.pending_approvals_of(conn, user, limit + 1, after)
    page = pending[:limit]
    more = len(pending) > limit
    return JSONResponse(
        {
            "approvals": [approval_json(a) for a in page],
            "next": approval_pages.cursor(page[-1].waiting_since, page[-1].idempotency_key) if more else None,
        }
    )


KEY = re.compile(r"[0-9a-f]{64}")  # runrow.tool_call_key's form; anything else names no call
MAX_NOTE = 10000  # tool_effect.decision_note's limit


async def decide(request: Request, svc: Services, user: str) -> Response:
    key = request.path_params["key"]
    if not KEY.fullmatch(key):
        raise not_found("pending approval", repr(key[:80]))
    body = await read_json_object(request, svc.config.max_body_bytes)
    reject_unknown(body, {"approved", "note"})
    approved = field(body, "approved", bool, "true or false")
    if approved is None:
        raise ApiError(400, "invalid_request", "approved is required: true or false")
    note = text(body, "note", "a string", max_chars=MAX_NOTE)
    try:
        async with svc.pool.connection() as conn:
            pending = await queries.pending_approval(conn, key, user)
            if pending is None:
                raise not_found("pending approval", key)
            run_id = await resolve_approval(conn, key, approved, decided_by=user, note=note)
    except psycopg.errors.ObjectNotInPrerequisiteState as exc:
        # Someone decided (or the run was stopped) between our read and the decision.
        raise ApiError(409, "already_decided", exc.diag.message_primary or str(exc)) from None
    return JSONResponse(
        {
            "idempotency_key": key,
            "run_id": str(run_id),
            "approved": approved,
            "decided_by": user,
            "note": note,
        }
    )


routes = [
    Route("/approvals", authenticated(list_approvals, query=frozenset({"limit", "after"})), methods=["GET"]),
    Route("/approvals/{key}", authenticated(decide), methods=["POST"]),
]
