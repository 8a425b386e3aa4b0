"""Typed wrappers of the webhook outbox functions (runrow.*webhook*), as pyworker.db.api does for
the run lifecycle: one `SELECT ... FROM runrow.fn(name => value)` each, on a caller's connection."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import class_row


@dataclass(frozen=True)
class Delivery:
    delivery_id: UUID
    claim_token: UUID
    run_id: UUID
    url: str
    # The payload as the database's JSON text, decoded by the sender one delivery at a time: a
    # payload Python cannot decode (nested past its recursion limit) failed the whole claim's
    # fetch after the leases were granted, so every delivery claimed beside it lapsed with it.
    payload_json: str
    attempt: int
    claim_expires_at: datetime
    claimed_at: datetime


async def claim_webhook_deliveries(
    conn: AsyncConnection,
    worker_id: str | None,
    max_deliveries: int,
    lease_seconds: int,
    max_attempts: int,
    max_per_receiver: int,
) -> list[Delivery]:
    """At most max_deliveries due deliveries, none to a receiver (scheme://host:port) that
    already has max_per_receiver leases anywhere in the fleet."""
    async with conn.cursor(row_factory=class_row(Delivery)) as cur:
        await cur.execute(
            "SELECT delivery_id, claim_token, run_id, url, payload::text AS payload_json, attempt, "
            "claim_expires_at, claimed_at "
            "FROM runrow.claim_webhook_deliveries(worker_id => %s, max_deliveries => %s, "
            "lease_seconds => %s, max_attempts => %s, max_per_receiver => %s)",
            (worker_id, max_deliveries, lease_seconds, max_attempts, max_per_receiver),
        )
        return await cur.fetchall()


async def complete_webhook_delivery(
    conn: AsyncConnection, delivery_id: UUID, claim_token: UUID, http_status: int
) -> bool:
    cur = await conn.execute(
        "SELECT runrow.complete_webhook_delivery(delivery_id => %s, claim_token => %s, http_status => %s)",
        (delivery_id, claim_token, http_status),
    )
    row = await cur.fetchone()
    return bool(row and row[0])


async def fail_webhook_delivery(
    conn: AsyncConnection,
    delivery_id: UUID,
    claim_token: UUID,
    error: str,
    http_status: int | None,
    max_attempts: int,
    backoff_seconds: float,
    permanent: bool = False,
) -> str | None:
    """'retrying', 'dead', or None when fenced out (the lease was taken over). permanent: the
    failure will recur identically, so it is dead-lettered on this attempt."""
    cur = await conn.execute(
        "SELECT runrow.fail_webhook_delivery(delivery_id => %s, claim_token => %s, error => %s, "
        "http_status => %s, max_attempts => %s, backoff_seconds => %s::numeric, permanent => %s)",
        (
            delivery_id,
            claim_token,
            error[:10000] or "failed",
            http_status,
            max_attempts,
            backoff_seconds,
            permanent,
        ),
    )
    row = await cur.fetchone()
    return None if row is None else row[0]
