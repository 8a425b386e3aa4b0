"""How a model turn committed by an earlier attempt ended, beyond its stop_reason.

The step log keeps a turn's stop_reason; which of the run's stop_sequences fired and the
refusal's stop_details travel in the turn's `model_turn` event, committed in the same
transaction as the step. A resumed attempt that ends on such a turn reads them back from
there, so its result says what the first attempt's would have said. A fork's steps
1..forked_at_seq are copies of its source's (fork_run copies no events): their events are
in the source's journal, or further up a chain of forks."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from pyworker.db import forks as forks_api
from pyworker.worker.handler import RunContext
from pyworker.worker.journal_pages import run_journal

ENDING_FIELDS = ("stop_details", "stop_sequence")
# Only these endings carry one of ENDING_FIELDS: an end_turn resumes without reading a journal.
WITH_FIELDS = ("stop_sequence", "refusal")


def ending_fields(message: dict[str, Any]) -> dict[str, Any]:
    """The fields of a model message (or of its model_turn event) that a result carries."""
    return {field: message[field] for field in ENDING_FIELDS if message.get(field) is not None}


async def recorded_ending(ctx: RunContext, step_seq: int, stop_reason: str | None) -> dict[str, Any]:
    """ending_fields of the model_turn event committed with step `step_seq` of this run (or of
    the run it was forked from, for a copied step): a walk of the journal, made only when a
    resumed attempt ends on a turn it did not make, with a stop_reason that has such fields."""
    if stop_reason not in WITH_FIELDS:
        return {}
    run_id: UUID | None = ctx.run.run_id
    while run_id is not None:
        found: dict[str, Any] | None = None
        async for event in run_journal(ctx, run_id):
            if event.type == "model_turn" and event.payload.get("step_seq") == step_seq:
                found = ending_fields(event.payload)
        if found is not None:
            return found
        request = await ctx.db(
            lambda conn, run=run_id: forks_api.get_run_request(conn, run), "get_run_request"
        )
        copied = request.forked_at_seq is not None and step_seq <= request.forked_at_seq
        run_id = request.forked_from if copied else None
    return {}
