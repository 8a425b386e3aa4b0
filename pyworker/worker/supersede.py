"""Take back what an earlier attempt streamed and this attempt does not keep.

A run claimed again (its worker died, its lease lapsed, it was released) still has in its
journal what the earlier attempts streamed, for example the deltas of a model turn that was
cut off before it was committed. The new attempt does that work again, so a client that
concatenates every `text_delta` would show the text twice. At the start of such an attempt
the handler journals one event that any client can follow:

    {"type": "superseded", "after_seq": A, "through_seq": B, "attempt": N}

Events with A < seq <= B come from earlier attempts' work that attempt N does not keep:
their deltas are not part of the answer. A is the seq of the last event that closed work the
handler keeps (one of its `committed` event types, e.g. the agent's `model_turn` and
`tool_result`), else the run's first `run_claimed` (a handler that starts over keeps
nothing); B is the seq just before attempt N's `run_claimed`. The event is written only when
that range holds a delta, so a run that resumes cleanly (after an approval, or a crash
between steps) gets none.

Finding A and B reads the run's journal once, by its primary key, and only on attempt 2 or
later: resumes are rare, and attempt 1 can follow an earlier claim only when that claim was
handed back with its attempt given back (defer_run: a key error, a rate limit or a budget wait;
a park on an approval). That hand-back journals `superseded` itself, in SQL
(functions/_supersede.sql), for what the claim streamed and did not commit: a key error's
`error` event mid-stream left a turn's deltas in the answer when nobody did (the worker audit).
Deltas a `superseded` event already took back are not taken back again.

An attempt that does the work again itself, in place (the agent after a `rate_limit_error`
event that cut a response mid-stream: the 429 is waited out and the model asked again, same
attempt), journals the same event first (`supersede_in_place`), B then the journal's last seq:
the client saw the cut response's deltas, and then saw the whole answer after them (the review
of 97011fe: the text twice).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from pyworker.worker.handler import RunContext
from pyworker.worker.journal import DELTA_FIELDS
from pyworker.worker.journal_pages import run_journal


async def supersede_earlier_attempts(
    ctx: RunContext, committed: Collection[str] = ()
) -> dict[str, Any] | None:
    """Journal `superseded` for what earlier attempts streamed after the last `committed`
    event; returns the event, or None when there is nothing to take back. Call it before the
    attempt emits anything."""
    if ctx.run.attempt <= 1:
        return None
    journal = await _read_journal(ctx, committed)
    if len(journal.claims) < 2:
        return None  # this attempt's claim is the run's first: nothing came before it
    # The latest claim is this attempt's: no one else can claim it now.
    return await _take_back(ctx, journal, journal.claims[-1] - 1)


async def supersede_in_place(ctx: RunContext, committed: Collection[str] = ()) -> dict[str, Any] | None:
    """Journal `superseded` for what THIS attempt streamed after the last `committed` event,
    before it does that work again in place (the agent asks the model again after a
    `rate_limit_error` event mid-stream, same attempt): B is the journal's last seq. Reads the
    run's journal, as a resumed attempt does: only after a response that failed mid-stream
    having streamed deltas."""
    await ctx.journal.flush()  # this attempt's deltas are in the journal before B is read
    journal = await _read_journal(ctx, committed)
    return await _take_back(ctx, journal, journal.last)


@dataclass
class _Journal:
    claims: list[int]  # seqs of run_claimed
    kept: int  # seq of the last event closing work the handler keeps
    deltas: list[int]  # seqs of deltas after `kept` no superseded event took back
    last: int  # the last seq


async def _read_journal(ctx: RunContext, committed: Collection[str]) -> _Journal:
    journal = _Journal([], 0, [], 0)
    async for event in run_journal(ctx):
        journal.last = event.seq
        if event.type == "run_claimed":
            journal.claims.append(event.seq)
        elif event.type in committed:
            journal.kept, journal.deltas = event.seq, []
        elif event.type in DELTA_FIELDS:
            journal.deltas.append(event.seq)
        elif event.type == "superseded":
            through = event.payload.get("through_seq")
            if isinstance(through, int):
                journal.deltas = [seq for seq in journal.deltas if seq > through]
    return journal


async def _take_back(ctx: RunContext, journal: _Journal, through: int) -> dict[str, Any] | None:
    after = max(journal.kept, journal.claims[0]) if journal.claims else journal.kept
    if not any(after < seq <= through for seq in journal.deltas):
        return None
    event = {"type": "superseded", "after_seq": after, "through_seq": through, "attempt": ctx.run.attempt}
    await ctx.journal.emit(event)
    ctx.log.info("superseded seqs %d..%d: streamed and not kept", after + 1, through)
    return event
