"""Typed async wrappers for fork_run and get_run_request: a run's history copied into a new
conversation, and what a run's model requests are made of (for `runrow replay`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import class_row


@dataclass(frozen=True)
class Fork:
    new_run_id: UUID
    new_conversation_id: UUID
    steps_copied: int
    must_drop: list[dict[str, Any]]  # {run_id, seq, index, type}: thinking the new model cannot take


@dataclass(frozen=True)
class RunRequest:
    conversation_id: UUID
    status: str
    model: str
    prompt_id: str
    system_prompt: str | None
    tools: Any
    metadata: dict[str, Any]
    forked_from: UUID | None
    forked_at_seq: int | None


async def fork_run(conn: AsyncConnection, run_id: UUID, at_seq: int, model: str | None = None) -> Fork:
    async with conn.cursor(row_factory=class_row(Fork)) as cur:
        await cur.execute(
            "SELECT new_run_id, new_conversation_id, steps_copied, must_drop "
            "FROM runrow.fork_run(run_id => %s, at_seq => %s, model => %s)",
            (run_id, at_seq, model),
        )
        row = await cur.fetchone()
    assert row is not None  # fork_run raises rather than return nothing
    return row


async def get_run_request(conn: AsyncConnection, run_id: UUID) -> RunRequest:
    async with conn.cursor(row_factory=class_row(RunRequest)) as cur:
        await cur.execute(
            "SELECT conversation_id, status, model, prompt_id, system_prompt, tools, metadata, forked_from, "
            "forked_at_seq FROM runrow.get_run_request(run_id => %s)",
            (run_id,),
        )
        row = await cur.fetchone()
    assert row is not None  # get_run_request raises P0002 rather than return nothing
    return row
