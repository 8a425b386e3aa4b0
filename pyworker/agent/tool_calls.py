"""Run the tool calls of a model turn through begin_tool_call / complete_tool_call.

Per tool_use block, in order (only the ones without a tool_result step):
- not in this worker's registry: an is_error tool_result (append_step) the model sees;
- key = tool_call_key(run, step seq, tool_use id, tool, input) (pyworker/db/keys.py, the SQL's twin);
- begin_tool_call says: `execute` (run it with the key; a resumed attempt of a non_idempotent tool
  gets the same key again, for the downstream service to dedup) | `done` (recorded by an earlier
  attempt; nothing to do) | `approved` (a person said yes: run it now) | `rejected` (tell the model,
  is_error) | `needs_approval` / `uncertain` (the SQL parked the run as waiting; stop: `parked`);
- complete_tool_call records the result and appends the tool_result step in one transaction.
A tool that raises gives an is_error tool_result with the exception's text; the run goes on.
So does any exception a tool raises (SystemExit from a script, a CancelledError of its own: the
first stopped the worker, the second was taken for a stop), and a result the database cannot
store (over 8 MiB, a U+0000 jsonb cannot hold): the model is told the result cannot be shown.

A stop while a tool runs (pyworker/agent/tools.py, "Cooperative cancellation"): a tool that takes
`cancel` gets the signal and up to its cancel_grace to return; an async pure/idempotent tool
without it is cancelled at once; any other tool is awaited to its end. A call cut short is
recorded with interrupt_tool_call: non_idempotent/irreversible become uncertain (any later
begin parks the run for a person), pure/idempotent get a "cancelled" is_error result. The
same holds when the handler itself is cancelled (drain past its budget), except that a
pure/idempotent call is left to run again on the resumed attempt.

Through a transient database error (restart, failover) each of these calls is made again on a
fresh connection (`ctx.db`, pyworker/db/retry.py). A repeat after a first try whose COMMIT
went unanswered is safe because the SQL answers it as it answered the first: begin_tool_call
says execute again (same key) for a pure, idempotent or non_idempotent call (an approved
irreversible one reads as uncertain and goes back to a person: the safe side),
complete_tool_call returns the same seq for the same result, interrupt_tool_call the same state
(a pure or idempotent call's repeat journals a second tool_interrupted). An unknown tool's
is_error tool_result is a plain append_step, which would append twice: its transaction reads
back the step it took instead.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection

from pyworker.agent.tools import CancelSignal, Tool, ToolCancelled, ToolError, ToolRegistry
from pyworker.db import steps as steps_api
from pyworker.db.keys import tool_call_key
from pyworker.worker import metrics, tracing
from pyworker.worker.failures import DeterministicFailure
from pyworker.worker.handler import RunContext
from pyworker.worker.journal import RunLost

STOPPED_RESULT = "Cancelled: the run was stopped while this tool ran, before it finished."


class Parked(Exception):
    """begin_tool_call parked the run on a person (needs_approval or uncertain)."""

    def __init__(self, state: str, key: str, tool: str):
        super().__init__(f"{tool}: {state} ({key})")
        self.state = state
        self.key = key
        self.tool = tool


def _json_result(value: Any) -> Any:
    """A tool's return value as JSON (what complete_tool_call stores and the model reads). Handed to
    complete_tool_call as is: the SQL decides what the tool_result's content is (a string or a list
    of content blocks as itself, anything else, a list of rows included, as its JSON text)."""
    if value is None:
        return ""
    try:
        # allow_nan=False: NaN and Infinity are not JSON, and jsonb refused the whole result.
        return json.loads(json.dumps(value, ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return str(value)


# Characters of a tool's result the model is sent at most (worker config max_tool_result_chars):
# about 50,000 tokens, a quarter of a 200k window. complete_tool_call stores up to 8 MiB, and a
# 5 MB result was stored and then refused by the API on the next request ("prompt is too long"),
# failing the run and every retry of it (the long-conversation audit).
MAX_TOOL_RESULT_CHARS = 200_000


def _within_limit(ctx: RunContext, name: str, result: Any, is_error: bool) -> tuple[Any, bool]:
    """The result, or an is_error text naming the tool when it is longer than the limit: the
    model is told, and can ask for less, as for a tool that raised."""
    limit = int(ctx.config.get("max_tool_result_chars", MAX_TOOL_RESULT_CHARS))
    size = len(result) if isinstance(result, str) else len(json.dumps(result, ensure_ascii=False))
    if size <= limit:
        return result, is_error
    ctx.log.warning("tool %s returned %d characters, more than %d: not sent", name, size, limit)
    return (
        f"The tool {name} ran, but returned {size:,} characters, more than this worker sends to the "
        f"model ({limit:,}, worker config max_tool_result_chars); its result was not sent. Ask it for "
        "less (a narrower query, a page of the result).",
        True,
    )


def _rejection_text(decision: Any) -> str:
    decision = decision or {}
    text = f"A person rejected this call ({decision.get('decided_by') or 'unknown'})."
    if decision.get("note"):
        text += f" Note: {decision['note']}"
    return text + " It was not run."


async def run_tool_calls(
    ctx: RunContext,
    registry: ToolRegistry,
    step_seq: int,
    tool_uses: list[dict[str, Any]],
    stop_requested: Callable[[], bool],
    before_park: Callable[[], Awaitable[None]],
) -> bool:
    """Answer `tool_uses` (all from model_turn `step_seq`). False when stopped between calls."""
    run = ctx.run
    # Only what the run offered runs: the worker's registry may hold tools this run was never
    # given (the security audit: a model naming any registered tool had it run).
    offered = {t.get("name") for t in (run.tools or []) if isinstance(t, dict)}
    for block in tool_uses:
        if stop_requested():
            return False
        name, use_id, args = block["name"], block["id"], block.get("input") or {}
        tool = registry.get(name) if name in offered else None
        if tool is None:
            with tracing.tool_call(name, "unknown") as call:
                call.outcome = "unknown_tool"
                why = "this run was not offered it"
                if name in offered:
                    why = "this worker has no tool of that name"
                await _unknown_tool(ctx, block, why)
            continue
        with tracing.tool_call(name, tool.effect) as call:
            key = tool_call_key(run.run_id, step_seq, use_id, name, args)
            # Everything journaled so far lands before a possible park clears the claim.
            await before_park()
            try:
                begun = await ctx.db(
                    lambda conn, key=key, name=name, args=args, tool=tool: steps_api.begin_tool_call(
                        conn, run.run_id, run.claim_token, key, name, args, tool.effect
                    ),
                    "begin_tool_call",
                )
            except psycopg.DataError as exc:
                # e.g. a NUL in the input: tool_effect.args is jsonb, which cannot hold U+0000.
                raise DeterministicFailure(
                    f"tool call {name} ({use_id}): its input cannot be recorded, so the call cannot be "
                    f"made safely: {_db_message(exc)}"
                ) from exc
            if begun is None:
                metrics.fenced("begin_tool_call")
                call.outcome = "lost"
                raise RunLost(str(run.run_id))
            state = call.state = begun.state
            ctx.log.info("tool %s (%s, %s): %s", name, tool.effect, key[:12], state)
            if state in ("needs_approval", "uncertain"):
                call.outcome = "parked"
                raise Parked(state, key, name)
            await ctx.journal.emit(
                {
                    "type": "tool_call",
                    "tool": name,
                    "tool_use_id": use_id,
                    "effect": tool.effect,
                    "idempotency_key": key,
                    "state": state,
                }
            )
            if state == "done":
                call.outcome = "replayed"  # its result is in the log already: nothing runs
                continue
            if state == "rejected":
                call.outcome = "rejected"
                result, is_error = _rejection_text(begun.result), True
            else:  # execute, approved
                ran = await _execute(ctx, tool, args, key)
                if ran is None:
                    call.outcome = "stopped"
                    await _record_stopped(ctx, tool, key, use_id)
                    return False
                result, is_error = _within_limit(ctx, name, ran.result, ran.is_error)
                call.outcome = "error" if is_error else "ok"
            try:
                seq = await _complete(ctx, key, result, is_error)
            except psycopg.DataError as exc:
                # The tool ran; what it returned cannot be stored, and would be refused the same
                # way on every attempt. The model is told, as for a tool that raised (the run
                # used to end failed on it). The refused transaction wrote nothing.
                ctx.log.warning("tool %s: its result cannot be recorded: %s", name, _db_message(exc))
                result, is_error = (
                    f"The tool ran, but its result cannot be recorded: {_db_message(exc)}",
                    True,
                )
                call.outcome = "error"
                try:
                    seq = await _complete(ctx, key, result, is_error)
                except psycopg.DataError as again:
                    raise DeterministicFailure(
                        f"tool call {name} ({use_id}): its result cannot be recorded: {_db_message(again)}"
                    ) from again
            if seq is None:
                metrics.fenced("complete_tool_call")
                call.outcome = "lost"
                raise RunLost(str(run.run_id))
            await ctx.journal.emit(
                {
                    "type": "tool_result",
                    "tool": name,
                    "tool_use_id": use_id,
                    "step_seq": seq,
                    "is_error": is_error,
                }
            )
    return True


@dataclass(frozen=True)
class Ran:
    """What a tool that ran to its end produced (an exception is an is_error result)."""

    result: Any
    is_error: bool


async def _run(
    ctx: RunContext, tool: Tool, args: dict[str, Any], key: str, signal: CancelSignal
) -> Ran | None:
    """The tool's own outcome; None when it stopped part-way on the cancel signal."""
    try:
        value = await tool.call(args, key, signal)
    except ToolCancelled as exc:
        if not signal.is_set():  # nobody asked it to stop: an ordinary failure
            return Ran(f"ToolCancelled: {exc}", True)
        ctx.log.info("tool %s stopped part-way: %s", tool.name, exc)
        return None
    except ToolError as exc:  # the tool says what happened, also when it answers a stop
        return Ran(str(exc), True)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # this task was cancelled (a stop, a drain): _execute records the cut
        # The tool's own (a cancelled inner future, a misused timeout): its failure, not a stop.
        return _raised(ctx, tool, signal, exc)
    except Exception as exc:
        return _raised(ctx, tool, signal, exc)
    except BaseException as exc:
        # SystemExit or KeyboardInterrupt raised by the tool's code (a sync tool's thread hands
        # it over): it crossed the event loop and stopped the worker, every run it held with it.
        return _raised(ctx, tool, signal, exc)
    return Ran(_json_result(value), False)


def _raised(ctx: RunContext, tool: Tool, signal: CancelSignal, exc: BaseException) -> Ran | None:
    if signal.is_set():
        # Failing on its way out after the signal: how far it got is unknown.
        ctx.log.warning("tool %s raised after its cancel signal: %s", tool.name, exc)
        return None
    ctx.log.warning("tool %s raised: %s", tool.name, exc, exc_info=True)
    return Ran(f"{type(exc).__name__}: {exc}".replace("\x00", "\\u0000"), True)


def _outcome(task: asyncio.Future[Ran | None]) -> Ran | None:
    return None if task.cancelled() else task.result()


def _db_message(exc: psycopg.Error) -> str:
    text = exc.diag.message_primary or str(exc)
    if exc.diag.message_detail:
        text = f"{text} ({exc.diag.message_detail})"
    return f"SQLSTATE {exc.sqlstate}: {text}" if exc.sqlstate else text


async def _execute(ctx: RunContext, tool: Tool, args: dict[str, Any], key: str) -> Ran | None:
    """Run the tool, minding a stop (ctx.cancel). None: the stop cut it short, no result."""
    signal = tool.new_cancel_signal()
    task = asyncio.ensure_future(_run(ctx, tool, args, key, signal))
    stopped = asyncio.ensure_future(ctx.cancel.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return _outcome(task)
        if tool.wants_cancel:
            ctx.log.info("stop: telling tool %s (up to %.1fs to return)", tool.name, tool.cancel_grace)
            signal.set()
            if (await asyncio.wait({task}, timeout=tool.cancel_grace))[0]:
                return _outcome(task)
            ctx.log.warning(
                "tool %s did not return within %.1fs of its cancel signal", tool.name, tool.cancel_grace
            )
            task.cancel()  # a sync tool's thread cannot be stopped: it runs on, its result unused
            return None
        if tool.is_async and tool.effect in ("pure", "idempotent"):
            ctx.log.info("stop: cancelling %s tool %s", tool.effect, tool.name)
            task.cancel()
            # Bounded: a tool that swallows the cancellation is not waited on for ever.
            await asyncio.wait({task}, timeout=tool.cancel_grace)
            return None
        ctx.log.info("stop: waiting for tool %s to finish (it takes no cancel signal)", tool.name)
        await asyncio.wait({task})
        return _outcome(task)
    except asyncio.CancelledError:
        # The handler itself is cancelled: a drain past its budget, or the claim was lost.
        signal.set()
        task.cancel()
        if not ctx.lost.is_set():
            await _record_interrupted(ctx, tool, key, "drained: the worker stopped while the tool ran")
        raise
    finally:
        stopped.cancel()


async def _record_interrupted(ctx: RunContext, tool: Tool, key: str, reason: str) -> str | None:
    """interrupt_tool_call after the journal so far; the call's state, None when fenced out."""
    run = ctx.run
    try:
        await ctx.journal.flush()  # what was journaled lands before the SQL's own event
    except RunLost:
        return None
    state = await ctx.db(
        lambda conn: steps_api.interrupt_tool_call(conn, run.run_id, run.claim_token, key, reason),
        "interrupt_tool_call",
    )
    ctx.log.warning("tool %s (%s, %s) cut short: %s", tool.name, tool.effect, key[:12], state)
    return state


async def _record_stopped(ctx: RunContext, tool: Tool, key: str, use_id: str) -> None:
    """A stop cut the call short: uncertain when unsafe to repeat, else a cancelled result."""
    state = await _record_interrupted(ctx, tool, key, "stopped: the run was stopped while the tool ran")
    if state is None:
        raise RunLost(str(ctx.run.run_id))
    if state != "executing":  # uncertain: a person decides; done: its result landed first
        return
    run = ctx.run
    seq = await _complete(ctx, key, STOPPED_RESULT, True)
    if seq is None:
        raise RunLost(str(run.run_id))
    await ctx.journal.emit(
        {"type": "tool_result", "tool": tool.name, "tool_use_id": use_id, "step_seq": seq, "is_error": True}
    )


async def _complete(ctx: RunContext, key: str, result: Any, is_error: bool) -> int | None:
    run = ctx.run
    return await ctx.db(
        lambda conn: steps_api.complete_tool_call(conn, run.run_id, run.claim_token, key, result, is_error),
        "complete_tool_call",
    )


async def _unknown_tool(ctx: RunContext, block: dict[str, Any], why: str) -> None:
    run = ctx.run
    payload = json.dumps(
        {
            "type": "tool_result",
            "tool_use_id": block["id"],
            "content": f"Unknown tool {block['name']!r}: {why}.",
            "is_error": True,
        },
        ensure_ascii=False,
    )

    async def append(conn: AsyncConnection[Any]) -> int:
        seq = await steps_api.append_step(conn, run.run_id, run.claim_token, "tool_result", payload)
        if seq is None:
            raise RunLost(str(run.run_id))
        return seq

    assert ctx.retry is not None
    seq = await ctx.retry.transaction(
        ctx.pool,
        append,
        "append_step",
        landed=lambda conn, seq: steps_api.step_landed(conn, run.run_id, run.attempt, seq, "tool_result"),
    )
    ctx.log.warning("model called unknown tool %s: %s", block["name"], why)
    await ctx.journal.emit(
        {
            "type": "tool_result",
            "tool": block["name"],
            "tool_use_id": block["id"],
            "step_seq": seq,
            "is_error": True,
        }
    )
