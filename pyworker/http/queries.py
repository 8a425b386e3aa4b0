"""Reads the service needs beyond pyworker.db.api: the client function get_run with every column
a client sees, and the documented pending_approvals view, filtered to one user (get_conversation
is pyworker.db.api's, which the CLI's stop uses too)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString, TypeVar
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import class_row

from pyworker.db.steps import PENDING_APPROVAL_COLUMNS, PendingApproval

T = TypeVar("T")


@dataclass(frozen=True)
class RunState:
    id: UUID
    conversation_id: UUID
    user_id: str | None
    status: str
    attempt: int
    max_attempts: int
    model: str
    cancel_requested: bool
    retry_of: UUID | None
    result: Any
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


async def get_run(conn: AsyncConnection, run_id: UUID) -> RunState:
    """Raises psycopg.errors.NoDataFound (P0002) for an unknown run."""
    return await _one(conn, RunState, "SELECT * FROM runrow.get_run(run_id => %s)", run_id)


async def _one(conn: AsyncConnection, row_type: type[T], query: LiteralString, key: UUID) -> T:
    """The row of a runrow function that returns exactly one or raises (NoDataFound)."""
    async with conn.cursor(row_factory=class_row(row_type)) as cur:
        await cur.execute(query, (key,))
        row = await cur.fetchone()
    assert row is not None
    return row


async def pending_approvals_of(
    conn: AsyncConnection, user_id: str, limit: int, after: tuple[datetime, str] | None = None
) -> list[PendingApproval]:
    """Up to `limit` of the user's pending approvals in (waiting_since, idempotency_key) order,
    past `after`, a (waiting_since, idempotency_key) of the page before (keyset pagination: a
    page is not shifted by approvals decided since the one before)."""
    async with conn.cursor(row_factory=class_row(PendingApproval)) as cur:
        if after is None:
            await cur.execute(
                f"SELECT {PENDING_APPROVAL_COLUMNS} FROM runrow.pending_approvals WHERE user_id = %s "
                "ORDER BY waiting_since, idempotency_key LIMIT %s",
                (user_id, limit),
            )
        else:
            await cur.execute(
                f"SELECT {PENDING_APPROVAL_COLUMNS} FROM runrow.pending_approvals WHERE user_id = %s "
                "AND (waiting_since, idempotency_key) > (%s, %s) ORDER BY waiting_since, idempotency_key "
                "LIMIT %s",
                (user_id, *after, limit),
            )
        return await cur.fetchall()


async def pending_approval(
    conn: AsyncConnection, idempotency_key: str, user_id: str
) -> PendingApproval | None:
    async with conn.cursor(row_factory=class_row(PendingApproval)) as cur:
        await cur.execute(
            f"SELECT {PENDING_APPROVAL_COLUMNS} FROM runrow.pending_approvals "
            "WHERE idempotency_key = %s AND user_id = %s",
            (idempotency_key, user_id),
        )
        return await cur.fetchone()
