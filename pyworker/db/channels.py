"""NOTIFY channel names, spelled exactly as the SQL functions spell them."""

from __future__ import annotations

from uuid import UUID

ENQUEUED = "runrow_enqueued"  # payload: conversation_id; enqueue, requeue, every terminal path
CANCEL = "runrow_cancel"  # payload: run_id; stop or cancel of a running run


def events_channel(run_id: UUID | str) -> str:
    """Must equal SQL `runrow.events_channel(run_id)`: the prefix and 32 hex digits, no dashes."""
    return "runrow_events_" + UUID(str(run_id)).hex
