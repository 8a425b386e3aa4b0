"""Typed async wrappers of the schedule functions (runrow.create_schedule, drop_schedule,
fire_schedules, fire_schedules_pass) and of the runrow.schedules view. Named arguments only, as in api.py."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import class_row
from psycopg.types.json import Jsonb


@dataclass(frozen=True)
class Schedule:
    """A row of the runrow.schedules view."""

    name: str
    cron: str
    catch_up: str
    max_catch_up: int
    next_fire_at: datetime
    last_tick_at: datetime | None
    last_run_id: UUID | None
    last_run_status: str | None
    last_error: str | None
    conversation_id: UUID | None
    model: str
    user_id: str | None
    max_attempts: int
    if_active: str
    priority: int
    fairness_key: str | None
    concurrency_key: str | None
    created_at: datetime
    id: UUID


async def create_schedule(
    conn: AsyncConnection,
    name: str,
    cron: str,
    content: Any,
    model: str,
    *,
    conversation_id: UUID | None = None,
    user_id: str | None = None,
    system_prompt: str | None = None,
    tools: Any = None,
    metadata: dict[str, Any] | None = None,
    max_attempts: int = 1,
    if_active: str = "enqueue",
    catch_up: str = "latest",
    max_catch_up: int | None = None,
    priority: int = 0,
    fairness_key: str | None = None,
    concurrency_key: str | None = None,
) -> UUID:
    cur = await conn.execute(
        "SELECT runrow.create_schedule(name => %s, cron => %s, content => %s, model => %s, "
        "conversation_id => %s, user_id => %s, system_prompt => %s, tools => %s, metadata => %s, "
        "max_attempts => %s, if_active => %s, catch_up => %s, max_catch_up => %s, priority => %s, "
        "fairness_key => %s, concurrency_key => %s)",
        (
            name,
            cron,
            Jsonb(content),
            model,
            conversation_id,
            user_id,
            system_prompt,
            Jsonb([] if tools is None else tools),
            Jsonb({} if metadata is None else metadata),
            max_attempts,
            if_active,
            catch_up,
            max_catch_up,
            priority,
            fairness_key,
            concurrency_key,
        ),
    )
    row = await cur.fetchone()
    assert row is not None
    return UUID(str(row[0]))


async def drop_schedule(conn: AsyncConnection, name: str) -> None:
    await conn.execute("SELECT runrow.drop_schedule(name => %s)", (name,))


async def fire_schedules(conn: AsyncConnection, max_schedules: int = 100) -> int:
    """Runs enqueued by the ticks due now (the reaper's call)."""
    cur = await conn.execute("SELECT runrow.fire_schedules(max_schedules => %s)", (max_schedules,))
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def fire_schedules_pass(conn: AsyncConnection, max_schedules: int = 100) -> tuple[int, int]:
    """One firing pass: (runs enqueued, schedules moved on to their next tick)."""
    cur = await conn.execute(
        "SELECT enqueued, moved_on FROM runrow.fire_schedules_pass(max_schedules => %s)", (max_schedules,)
    )
    row = await cur.fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


async def list_schedules(conn: AsyncConnection, name: str | None = None) -> list[Schedule]:
    async with conn.cursor(row_factory=class_row(Schedule)) as cur:
        await cur.execute(
            "SELECT name, cron, catch_up, max_catch_up, next_fire_at, last_tick_at, last_run_id, "
            "last_run_status, last_error, conversation_id, model, user_id, max_attempts, if_active, "
            "priority, fairness_key, concurrency_key, created_at, id FROM runrow.schedules "
            "WHERE %s::text IS NULL OR name = %s ORDER BY name",
            (name, name),
        )
        return await cur.fetchall()
