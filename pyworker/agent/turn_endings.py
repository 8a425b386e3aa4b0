"""How a model turn ended: its stop_reason and, beyond it, the fields a result carries.

Which of the run's stop_sequences fired and a refusal's stop_details are kept on the turn's step
(append_step's stop_sequence and stop_details, migration 0108) as well as in its `model_turn`
event. A resumed attempt, or a fork, that ends on a turn it did not make reads them back from the
step log (get_step), so its result says what the first attempt's would have said. Not from the
journal: trim_journal deletes a finished run's events, and fork_run copies steps, not events, so
a fork of a run finished over a day ago ended without them. Steps written before migration 0108
have neither field: a run resumed on one ends with its stop_reason alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

from pyworker.db import steps as steps_api

ENDING_FIELDS = ("stop_details", "stop_sequence")


def ending_fields(message: dict[str, Any]) -> dict[str, Any]:
    """The fields of a model message (or of its model_turn event) that a result carries."""
    return {name: message[name] for name in ENDING_FIELDS if message.get(name) is not None}


@dataclass(frozen=True)
class TurnEnding:
    stop_reason: str | None
    fields: dict[str, Any] = field(default_factory=dict)  # ending_fields of the turn


def stored_fields(message: dict[str, Any]) -> dict[str, Any]:
    """append_step's stop_sequence and stop_details for a model message: only values of the types
    it takes (a string, an object), so an odd provider answer cannot fail the turn's commit."""
    sequence = message.get("stop_sequence")
    details = message.get("stop_details")
    return {
        "stop_sequence": sequence if isinstance(sequence, str) and sequence else None,
        "stop_details": details if isinstance(details, dict) else None,
    }


async def recorded_ending(conn: AsyncConnection, run_id: UUID, step_seq: int) -> TurnEnding:
    """How model_turn step `step_seq` of the run ended, from the step log (runrow.get_step): a
    fork's copied steps carry their source's ending, as fork_run copies every column."""
    info = await steps_api.get_step(conn, run_id, step_seq)
    kept = {"stop_sequence": info.stop_sequence, "stop_details": info.stop_details}
    return TurnEnding(info.stop_reason, ending_fields(kept))
