"""NOTIFY channel names, spelled exactly as the SQL functions spell them."""

from __future__ import annotations

from uuid import UUID

ENQUEUED = "runrow_enqueued"  # payload: conversation_id; enqueue, requeue, an ending that lets a run start
WEBHOOKS = "runrow_webhooks"  # payload: empty; a webhook delivery was written or re-armed
CANCEL = "runrow_cancel"  # payload: run_id; stop or cancel of a running run
EVENTS_PREFIX = "runrow_events_"  # + run id hex: payload last seq; only while a tail watches the run


def events_channel(run_id: UUID | str) -> str:
    """Must equal SQL `runrow.events_channel(run_id)`: the prefix and 32 hex digits, no dashes."""
    return EVENTS_PREFIX + UUID(str(run_id)).hex


def run_of_events_channel(channel: str) -> UUID | None:
    """The run a journal channel names, or None for any other channel."""
    if not channel.startswith(EVENTS_PREFIX):
        return None
    try:
        return UUID(hex=channel[len(EVENTS_PREFIX) :])
    except ValueError:
        return None
