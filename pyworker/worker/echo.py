"""A trivial run handler for tests and demos: streams the run's `metadata.echo` text back.

metadata: {"echo": "text", "duration": 2.0, "fail": false}. The text is emitted as text_delta
events in small steps spread over `duration` seconds; a stop or cancel ends it early with
Outcome('cancelled') and the partial text; `fail` raises after streaming (to test release).
A later attempt starts over, and first journals `superseded` for the text the earlier ones
streamed (pyworker/worker/supersede.py).
"""

from __future__ import annotations

from pyworker.db.aio import wait_event
from pyworker.worker.handler import Outcome, RunContext
from pyworker.worker.supersede import supersede_earlier_attempts

STEP_SECONDS = 0.05


async def handle(ctx: RunContext) -> Outcome:
    meta = ctx.run.metadata or {}
    text = str(meta.get("echo", "echo"))
    duration = float(meta.get("duration", 0.5))
    # Echo starts over on every attempt: nothing an earlier attempt streamed is kept.
    await supersede_earlier_attempts(ctx)
    # Written through without waiting for the commit: a short answer's text, message_stop and
    # ending join the same flush (echo makes no database call of its own after this).
    await ctx.journal.emit({"type": "message_start", "role": "assistant"}, wait=False)
    steps = max(1, int(duration / STEP_SECONDS))
    pieces = [text[i * len(text) // steps : (i + 1) * len(text) // steps] for i in range(steps)]
    sent = ""
    for piece in pieces:
        if ctx.cancel.is_set():
            ctx.log.info("echo: cancelled after %d characters", len(sent))
            await ctx.journal.emit({"type": "message_stop", "stop_reason": "cancelled"}, wait=False)
            return Outcome("cancelled", result={"text": sent})
        if piece:
            await ctx.journal.emit({"type": "text_delta", "index": 0, "text": piece})
            sent += piece
        if duration > 0:  # a zero-length run has nothing to wait for, and its ending rides its events' flush
            await wait_event(ctx.cancel, duration / steps)
    if meta.get("fail"):
        raise RuntimeError("echo: failing on purpose (metadata.fail)")
    await ctx.journal.emit({"type": "message_stop", "stop_reason": "end_turn"}, wait=False)
    return Outcome("completed", result={"text": sent})
