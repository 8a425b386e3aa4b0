"""Typed async wrappers for the durable-step functions (append_step, conversation_history,
get_step, begin_tool_call, complete_tool_call, interrupt_tool_call, resolve_approval) and the
pending_approvals view.

Like `pyworker.db.api`, each takes an `AsyncConnection` so calls compose in one transaction.
Step payloads travel as JSON *text* in both directions: the step log is `json`, stored and
returned byte for byte, and signed thinking blocks need exactly those bytes back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import class_row
from psycopg.types.json import Jsonb


@dataclass(frozen=True)
class HistoryRow:
    run_id: UUID
    turn_index: int
    message_index: int
    role: str
    source: str
    seq: int | None
    kind: str
    payload: str  # the stored json text, unparsed
    run_status: str


@dataclass(frozen=True)
class ToolCallState:
    state: str  # execute, done, needs_approval, approved, rejected, uncertain
    result: Any


@dataclass(frozen=True)
class PendingApproval:
    idempotency_key: str
    reason: str
    run_id: UUID
    conversation_id: UUID
    user_id: str | None
    tool: str
    args: dict[str, Any]
    effect: str
    tool_use_id: str
    step_seq: int
    previously_approved: bool | None
    previously_decided_by: str | None
    started_at: datetime | None
    created_at: datetime
    waiting_since: datetime


async def append_step(
    conn: AsyncConnection,
    run_id: UUID,
    claim_token: UUID,
    kind: str,
    payload_text: str,
    request_id: str | None = None,
    usage: dict[str, Any] | None = None,
    stop_reason: str | None = None,
    stop_sequence: str | None = None,
    stop_details: dict[str, Any] | None = None,
) -> int | None:
    """The new step's seq; None when fenced out. `payload_text` is stored as is; usage,
    stop_reason, stop_sequence and stop_details only for a model_turn."""
    cur = await conn.execute(
        "SELECT runrow.append_step(run_id => %s, claim_token => %s, kind => %s, payload => %s::json, "
        "request_id => %s, usage => %s, stop_reason => %s, stop_sequence => %s, stop_details => %s)",
        (
            run_id,
            claim_token,
            kind,
            payload_text,
            request_id,
            None if usage is None else Jsonb(usage),
            stop_reason,
            stop_sequence,
            None if stop_details is None else Jsonb(stop_details),
        ),
    )
    row = await cur.fetchone()
    return None if row is None else row[0]


async def conversation_history(
    conn: AsyncConnection, conversation_id: UUID, run_id: UUID
) -> list[HistoryRow]:
    async with conn.cursor(row_factory=class_row(HistoryRow)) as cur:
        await cur.execute(
            "SELECT run_id, turn_index, message_index, role, source, seq, kind, payload::text AS payload, "
            "run_status FROM runrow.conversation_history(conversation_id => %s, up_to_run_id => %s)",
            (conversation_id, run_id),
        )
        return await cur.fetchall()


@dataclass(frozen=True)
class StepInfo:
    kind: str
    stop_reason: str | None
    usage: dict[str, Any] | None
    request_id: str | None
    stop_sequence: str | None  # None on steps written before migration 0108
    stop_details: dict[str, Any] | None
    attempt: int
    created_at: datetime


async def get_step(conn: AsyncConnection, run_id: UUID, seq: int) -> StepInfo:
    """What the step log keeps beside step `seq`'s payload (stop_reason, usage, request id, and
    a model turn's stop_sequence and stop_details)."""
    async with conn.cursor(row_factory=class_row(StepInfo)) as cur:
        await cur.execute(
            "SELECT kind, stop_reason, usage, request_id, stop_sequence, stop_details, attempt, created_at "
            "FROM runrow.get_step(run_id => %s, seq => %s)",
            (run_id, seq),
        )
        row = await cur.fetchone()
    assert row is not None  # get_step raises P0002 rather than return nothing
    return row


async def step_landed(conn: AsyncConnection, run_id: UUID, attempt: int, seq: int, kind: str) -> bool:
    """Whether step `seq` is the `kind` step an append of attempt `attempt` took, for a
    transaction whose COMMIT went unanswered. While a claim holds the run nobody else appends
    its steps, and whoever takes the run from it appends at a later attempt; so a step at that
    seq of that attempt is the one the transaction wrote, and no step there means it did not
    commit."""
    try:
        info = await get_step(conn, run_id, seq)
    except psycopg.errors.NoDataFound:
        return False
    return info.attempt == attempt and info.kind == kind


async def begin_tool_call(
    conn: AsyncConnection,
    run_id: UUID,
    claim_token: UUID,
    idempotency_key: str,
    tool: str,
    args: dict[str, Any],
    effect: str,
) -> ToolCallState | None:
    """None when fenced out."""
    cur = await conn.execute(
        "SELECT state, result FROM runrow.begin_tool_call(run_id => %s, claim_token => %s, "
        "idempotency_key => %s, tool => %s, args => %s, effect => %s)",
        (run_id, claim_token, idempotency_key, tool, Jsonb(args), effect),
    )
    row = await cur.fetchone()
    return None if row is None else ToolCallState(state=row[0], result=row[1])


async def complete_tool_call(
    conn: AsyncConnection,
    run_id: UUID,
    claim_token: UUID,
    idempotency_key: str,
    result: Any,
    is_error: bool = False,
) -> int | None:
    """The tool_result step's seq; None when fenced out."""
    cur = await conn.execute(
        "SELECT runrow.complete_tool_call(run_id => %s, claim_token => %s, idempotency_key => %s, "
        "result => %s, is_error => %s)",
        (run_id, claim_token, idempotency_key, Jsonb(result), is_error),
    )
    row = await cur.fetchone()
    return None if row is None else row[0]


async def interrupt_tool_call(
    conn: AsyncConnection, run_id: UUID, claim_token: UUID, idempotency_key: str, reason: str
) -> str | None:
    """The call's state after the interruption (uncertain, executing or done); None when
    fenced out."""
    cur = await conn.execute(
        "SELECT runrow.interrupt_tool_call(run_id => %s, claim_token => %s, idempotency_key => %s, "
        "reason => %s)",
        (run_id, claim_token, idempotency_key, reason),
    )
    row = await cur.fetchone()
    return None if row is None else row[0]


async def resolve_approval(
    conn: AsyncConnection, idempotency_key: str, approved: bool, decided_by: str, note: str | None = None
) -> UUID:
    cur = await conn.execute(
        "SELECT runrow.resolve_approval(idempotency_key => %s, approved => %s, decided_by => %s, note => %s)",
        (idempotency_key, approved, decided_by, note),
    )
    row = await cur.fetchone()
    assert row is not None
    return row[0]


# The columns of runrow.pending_approvals that PendingApproval holds, in its order.
PENDING_APPROVAL_COLUMNS = (
    "idempotency_key, reason, run_id, conversation_id, user_id, tool, args, effect, tool_use_id, "
    "step_seq, previously_approved, previously_decided_by, started_at, created_at, waiting_since"
)


async def pending_approvals(conn: AsyncConnection) -> list[PendingApproval]:
    async with conn.cursor(row_factory=class_row(PendingApproval)) as cur:
        await cur.execute(
            f"SELECT {PENDING_APPROVAL_COLUMNS} FROM runrow.pending_approvals "
            "ORDER BY waiting_since, idempotency_key"
        )
        return await cur.fetchall()
