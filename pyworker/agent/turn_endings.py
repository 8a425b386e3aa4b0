"""How a model turn committed by an earlier attempt ended, beyond its stop_reason.

The step log keeps a turn's stop_reason; which of the run's stop_sequences fired and the
refusal's stop_details travel in the turn's `model_turn` event, committed in the same
transaction as the step. A resumed attempt that ends on such a turn reads them back from
there, so its result says what the first attempt's would have said."""

from __future__ import annotations

from typing import Any

from pyworker.worker.handler import RunContext
from pyworker.worker.journal_pages import run_journal

ENDING_FIELDS = ("stop_details", "stop_sequence")


def ending_fields(message: dict[str, Any]) -> dict[str, Any]:
    """The fields of a model message (or of its model_turn event) that a result carries."""
    return {field: message[field] for field in ENDING_FIELDS if message.get(field) is not None}


async def recorded_ending(ctx: RunContext, step_seq: int) -> dict[str, Any]:
    """ending_fields of the model_turn event committed with step `step_seq`: one walk of the
    run's journal, made only when a resumed attempt ends on a turn it did not make."""
    found: dict[str, Any] = {}
    async for event in run_journal(ctx):
        if event.type == "model_turn" and event.payload.get("step_seq") == step_seq:
            found = ending_fields(event.payload)
    return found
