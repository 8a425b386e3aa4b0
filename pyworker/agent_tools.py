"""Run the tool calls of a model turn through begin_tool_call / complete_tool_call.

Per tool_use block, in order (only the ones without a tool_result step):
- not in this worker's registry: an is_error tool_result (append_step) the model sees;
- key = tool_call_key(run, step seq, tool_use id, tool, input) (pyworker/keys.py, the SQL's twin);
- begin_tool_call says: `execute` (run it with the key; a resumed attempt of a non_idempotent tool
  gets the same key again, for the downstream service to dedup) | `done` (recorded by an earlier
  attempt; nothing to do) | `approved` (a person said yes: run it now) | `rejected` (tell the model,
  is_error) | `needs_approval` / `uncertain` (the SQL parked the run as waiting; stop: `parked`);
- complete_tool_call records the result and appends the tool_result step in one transaction.
A tool that raises gives an is_error tool_result with the exception's text; the run goes on.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from pyworker import steps_api
from pyworker.failures import DeterministicFailure
from pyworker.handler import RunContext
from pyworker.journal import RunLost
from pyworker.keys import tool_call_key
from pyworker.tools import Tool, ToolError, ToolRegistry


class Parked(Exception):
    """begin_tool_call parked the run on a person (needs_approval or uncertain)."""

    def __init__(self, state: str, key: str, tool: str):
        super().__init__(f"{tool}: {state} ({key})")
        self.state = state
        self.key = key
        self.tool = tool


def _json_result(value: Any) -> Any:
    """A tool's return value as JSON (what complete_tool_call stores and the model reads)."""
    if value is None:
        return ""
    try:
        return json.loads(json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError):
        return str(value)


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
    for block in tool_uses:
        if stop_requested():
            return False
        name, use_id, args = block["name"], block["id"], block.get("input") or {}
        tool = registry.get(name)
        if tool is None:
            await _unknown_tool(ctx, block)
            continue
        key = tool_call_key(run.run_id, step_seq, use_id, name, args)
        # Everything journaled so far lands before a possible park clears the claim.
        await before_park()
        try:
            async with ctx.pool.connection() as conn:
                begun = await steps_api.begin_tool_call(
                    conn, run.run_id, run.claim_token, key, name, args, tool.effect
                )
        except psycopg.DataError as exc:
            # e.g. a NUL in the input: tool_effect.args is jsonb, which cannot hold U+0000.
            raise DeterministicFailure(
                f"tool call {name} ({use_id}): its input cannot be recorded, so the call cannot be "
                f"made safely: {_db_message(exc)}"
            ) from exc
        if begun is None:
            raise RunLost(str(run.run_id))
        state = begun.state
        ctx.log.info("tool %s (%s, %s): %s", name, tool.effect, key[:12], state)
        if state in ("needs_approval", "uncertain"):
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
            continue
        if state == "rejected":
            result, is_error = _rejection_text(begun.result), True
        else:  # execute, approved
            result, is_error = await _execute(ctx, tool, args, key)
        try:
            async with ctx.pool.connection() as conn:
                seq = await steps_api.complete_tool_call(
                    conn, run.run_id, run.claim_token, key, result, is_error
                )
        except psycopg.DataError as exc:
            raise DeterministicFailure(
                f"tool call {name} ({use_id}): its result cannot be recorded: {_db_message(exc)}"
            ) from exc
        if seq is None:
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


def _db_message(exc: psycopg.Error) -> str:
    text = exc.diag.message_primary or str(exc)
    if exc.diag.message_detail:
        text = f"{text} ({exc.diag.message_detail})"
    return f"SQLSTATE {exc.sqlstate}: {text}" if exc.sqlstate else text


async def _execute(ctx: RunContext, tool: Tool, args: dict[str, Any], key: str) -> tuple[Any, bool]:
    try:
        value = await tool.call(args, key)
    except ToolError as exc:
        return str(exc), True
    except Exception as exc:  # the model sees the failure; the run does not crash
        ctx.log.warning("tool %s raised: %s", tool.name, exc, exc_info=True)
        return f"{type(exc).__name__}: {exc}", True
    return _json_result(value), False


async def _unknown_tool(ctx: RunContext, block: dict[str, Any]) -> None:
    run = ctx.run
    payload = json.dumps(
        {
            "type": "tool_result",
            "tool_use_id": block["id"],
            "content": f"Unknown tool {block['name']!r}: this worker has no tool of that name.",
            "is_error": True,
        },
        ensure_ascii=False,
    )
    async with ctx.pool.connection() as conn:
        seq = await steps_api.append_step(conn, run.run_id, run.claim_token, "tool_result", payload)
    if seq is None:
        raise RunLost(str(run.run_id))
    ctx.log.warning("model called unknown tool %s", block["name"])
    await ctx.journal.emit(
        {
            "type": "tool_result",
            "tool": block["name"],
            "tool_use_id": block["id"],
            "step_seq": seq,
            "is_error": True,
        }
    )
