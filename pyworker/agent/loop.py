"""The default run handler: the agent loop on the Anthropic SDK, durable step by step.

    runrow worker --tools myapp.tools          # handler pyworker.agent:handle is the default

Every iteration rebuilds the request from the step log (`conversation_history`, byte for byte) and
does the one next thing the log calls for: call the model, or run the tool calls still missing a
result. So a fresh run, a run resumed by another worker after a crash, and a run requeued after an
approval all take the same path, and nothing committed is redone (see pyworker/agent/history.py).

Model, system prompt and tools come from the run's pinned prompt; request parameters from the
run's metadata: `max_tokens` (default 4096), `thinking`, `temperature`, `top_p`, `top_k`,
`stop_sequences`, `tool_choice` (a forcing one, `any` or `tool`, only on the request that answers
the person's message; `auto` after it: pyworker/agent/model.py tool_choice_for). The tool
implementations come from the worker's `--tools` module; a tool the model calls that this worker
does not have is an is_error tool_result. At most `max_model_calls` model calls a run (worker
config, `runrow worker --max-model-calls`, default 100): the run's own, over all its attempts,
never the steps a fork was given (fork_run copies its source's steps 1..forked_at_seq).

Journal: `model_request` (a call starts), the deltas `text_delta` / `thinking_delta` /
`input_json_delta` {index, ...} (coalesced), `model_turn` {step_seq, stop_reason, usage,
request_id, model} written in the same transaction as the step, `tool_call`, `tool_result`
(and `approval_requested`, journaled by the SQL). A resumed attempt first journals
`superseded` {after_seq, through_seq, attempt} when an earlier attempt streamed deltas after
the last committed step: those deltas are not part of the answer (pyworker/worker/supersede.py).
So does an attempt that asks the model again in place after a response cut mid-stream (a
`rate_limit_error` event), before the new `model_request`.

How each stop_reason and failure ends (status / result / error):

| what happened                                   | run ends as                                          |
|-------------------------------------------------|------------------------------------------------------|
| end_turn, stop_sequence                         | completed, result {text, stop_reason} (and           |
|                                                 | stop_sequence: the one that fired)                   |
| tool_use                                        | tools run, loop continues                            |
| pause_turn                                      | content sent back as is, loop continues              |
| refusal                                         | completed, result {text, stop_reason: refusal, ...}  |
| max_tokens                                      | failed, error "max_tokens: ..." (result: the text)   |
| model_context_window_exceeded                   | failed, error "model_context_window_exceeded: ..."   |
| any other stop_reason                           | failed, error names it                               |
| max_model_calls turns made, and the loop would  | failed once, error "max_model_calls: ...", result    |
| go on (worker config, --max-model-calls 100)    | {text of the last turn, stop_reason max_model_calls} |
| before each request (pyworker/agent/limits.py)  | acquire_model_call: go; a short wait in place; a     |
|                                                 | long one released with retry_in; budget_exhausted:   |
|                                                 | failed "budget_exhausted: ..." (ended in SQL)        |
| 429 (or a rate_limit_error event mid-stream)    | not retried by the SDK: reported (the key is blocked |
|                                                 | fleet-wide for retry-after), then asked again; past  |
|                                                 | 5 in an attempt deferred (attempt given back), 3     |
|                                                 | times a run; then released, spending an attempt      |
| 429 whose stated input-tokens-per-minute limit  | failed once, the key not blocked (no wait cures it)  |
| is less than the request's own input            |                                                      |
| a response's rate-limit headers say a bucket is | the key is blocked fleet-wide until the bucket's     |
| empty (anthropic-ratelimit-*-remaining: 0)      | reset (at most 60 s); the answer streams on          |
| 529 / 5xx / connection error                    | retried by the SDK (max_retries, retry-after); then  |
|                                                 | released with backoff (retry-after, else exponential |
|                                                 | with jitter): requeued while attempts are left, else |
|                                                 | failed (max_attempts 1) or dead                       |
| `error` event mid-stream (APIStatusError 200):  | released with backoff, as above                      |
| overloaded_error, api_error, timeout_error      |                                                      |
| any other `error` event mid-stream              | failed once (it would recur), the usage paid         |
| a tool input the model streamed that is not     | released with backoff, as above (the model samples:  |
| JSON (the SDK's ValueError mid-stream)          | asked again it may answer JSON); error names the tool |
|                                                 | and the input; the usage paid                        |
| an event that is not JSON (any other error the  | released with backoff, as above; the usage paid      |
| SDK raises reading the stream)                  |                                                      |
| connection dropped mid-stream                   | released with backoff, as above                      |
| stream ended cleanly before message_stop        | released with backoff, as above: the partial snapshot |
|                                                 | is never committed (a tool input may be cut)         |
| a committed turn without stop_reason (an older  | failed, its tool calls never run (_ending)           |
| worker committed such a partial snapshot)       |                                                      |
| other 4xx (400 invalid signature, 401, 404 ...) | failed, error "model API refused the request: ..."   |
| the database refuses the run's own data (a NUL  | failed at once, never released for another paid     |
| in a tool's input: tool_effect.args is jsonb)   | attempt (pyworker/worker/failures.py)               |
| stop / cancel (between steps or mid-stream)     | cancelled, result {text: the partial text, ...}      |
| stop / cancel while a tool runs                 | the tool is told / cancelled / awaited               |
|                                                 | (pyworker/agent/tool_calls.py), then cancelled     |
| irreversible tool: needs approval / uncertain   | waiting (parked); requeued when a person decides     |
| claim lost (reaped, superseded)                 | nothing more is written by this worker               |
| database restart / failover (transient error)   | every call retried on a fresh connection; the fence  |
|                                                 | decides; after about a lease without a database the  |
|                                                 | run is given up quietly (a reaper takes it)          |

Every model turn is committed (append_step: the content array as the SDK produced it, thinking
and signatures included, with the request id, usage and stop_reason) before anything acts on
it, including the turns that end the run, so the step log is the full record.
"""

from __future__ import annotations

import asyncio
from typing import Any

from psycopg import AsyncConnection

from pyworker.agent import limits
from pyworker.agent.history import History, Step, load_history
from pyworker.agent.model import (
    TOO_LONG_REMEDY,
    ModelTurn,
    Received,
    TurnCancelled,
    TurnFailed,
    client_for,
    request_params,
    stream_turn,
)
from pyworker.agent.tool_calls import Parked, run_tool_calls
from pyworker.agent.tools import ToolRegistry, load_module
from pyworker.agent.tools import registry as default_registry
from pyworker.agent.turn_endings import TurnEnding, ending_fields, recorded_ending, stored_fields
from pyworker.db import api
from pyworker.db import forks as forks_api
from pyworker.db import steps as steps_api
from pyworker.worker.handler import Outcome, RunContext
from pyworker.worker.journal import RunLost
from pyworker.worker.settings import DEFAULT_MAX_MODEL_CALLS
from pyworker.worker.supersede import supersede_earlier_attempts, supersede_in_place

CONTINUE_REASONS = ("tool_use", "pause_turn")
COMMITTED_EVENTS = ("model_turn", "tool_result")  # journaled once their step is in the log


def tool_registry(ctx: RunContext) -> ToolRegistry:
    """The worker's tools: `config['registry']` if given (tests), else exactly the tools of
    `config['tools_module']` (`runrow worker --tools package.module`), else the default registry."""
    registry = ctx.config.get("registry")
    if isinstance(registry, ToolRegistry):
        return registry
    module = ctx.config.get("tools_module")
    if module:
        return load_module(module)  # imported once; later calls return its registry
    return default_registry


async def handle(ctx: RunContext) -> Outcome:
    registry = tool_registry(ctx)
    client = client_for(ctx.config)
    run = ctx.run
    known_stops: dict[int, TurnEnding] = {}  # how model turns ended, by seq
    rate_limited = 0  # 429s reported in this attempt
    cap = ModelCallCap(ctx)
    # A resumed attempt keeps the committed steps (each model_turn event commits with its
    # step) and redoes the rest: what an earlier attempt streamed after them is not the answer.
    await supersede_earlier_attempts(ctx, committed=COMMITTED_EVENTS)
    while True:
        if ctx.cancel.is_set():
            return await _cancelled(ctx, None)
        history = await ctx.db(
            lambda conn: load_history(conn, run.conversation_id, run.run_id), "history load"
        )
        if history.pending_tool_uses:
            assert history.last_model_turn is not None
            turn_seq = history.last_model_turn.seq
            if turn_seq not in known_stops:  # resumed: how did that turn end?
                known_stops[turn_seq] = await ctx.db(
                    lambda conn, seq=turn_seq: recorded_ending(conn, run.run_id, seq), "get_step"
                )
            made = known_stops[turn_seq]
            if made.stop_reason != "tool_use":
                # e.g. max_tokens cut a tool_use short: its input may be incomplete; never run it.
                # None too. A turn without a stop_reason is a stream that ended before
                # message_stop, committed by a worker from before that was a retryable failure
                # (or a step older than migration 0007's column: nothing tells the two apart),
                # and its tool_use input may be cut anywhere: running it must never happen. Nor
                # can the model be asked again past it (the step log is append-only and every
                # rebuild sends it back), so the run ends, failed once, saying so (_ending).
                return _ending(made.stop_reason, history.final_text(), made.fields)
            # At the cap no model call may follow, so nothing would read these results.
            capped = await cap.reached(history)
            if capped is not None:
                return capped
            try:
                finished = await run_tool_calls(
                    ctx,
                    registry,
                    turn_seq,
                    history.pending_tool_uses,
                    ctx.cancel.is_set,
                    ctx.journal.flush,
                )
            except Parked as parked:
                ctx.log.info("run parked: %s", parked)
                return Outcome("parked")
            if not finished:
                return await _cancelled(ctx, None)
            continue
        last = history.last_step
        if last is not None and last.kind == "model_turn":
            if last.seq not in known_stops:
                known_stops[last.seq] = await ctx.db(
                    lambda conn, seq=last.seq: recorded_ending(conn, run.run_id, seq), "get_step"
                )
            stop = known_stops[last.seq]
            if stop.stop_reason != "pause_turn":
                # A turn this attempt made ended the loop above; this one is an earlier attempt's
                # (or, in a fork, its source's: fork_run copies the step with how it ended).
                return _ending(stop.stop_reason, history.final_text(), stop.fields)
        capped = await cap.reached(history)
        if capped is not None:
            return capped
        # Call the model, once the fleet's limits and budgets allow it (pyworker/agent/limits.py).
        params = request_params(run, history.messages)
        ending = await limits.before_request(ctx, params)
        if ending is not None:
            return ending
        if ctx.cancel.is_set():
            continue
        await ctx.journal.emit({"type": "model_request", "step": len(history.steps) + 1, "model": run.model})
        received = Received()
        try:
            turn = await stream_turn(
                client, params, ctx.journal, ctx.cancel, received, lambda h: limits.after_headers(ctx, h)
            )
        except asyncio.CancelledError:
            # This task is being cancelled (a drain abandons the run, its claim was lost): the
            # stream is closed, but what it billed went unpaid, once per run a drain cut short.
            await limits.settle_interrupted(ctx, received.billed())
            raise
        except TurnCancelled as cancelled:
            await limits.settle_unstored(ctx, cancelled.usage)
            # A paused turn's continuation extends the same message: what was streamed of the
            # answer is the paused text and then this partial one (the tools audit: the result
            # kept the partial text alone, and a tail showed more than the run said).
            prefix = history.final_text() if _continues(history) else ""
            return await _cancelled(ctx, prefix + cancelled.partial_text)
        except TurnFailed as failed:
            await limits.settle_unstored(ctx, failed.usage)
            ctx.log.warning(
                "model turn failed (%s): %s", "retryable" if failed.retryable else "final", failed
            )
            ending = await limits.after_failure(ctx, failed, rate_limited, params)
            if ending is not None:
                return ending  # a later claim, or defer_run, takes back what this one streamed
            rate_limited += 1
            if received.streamed:
                # Asked again in this attempt (a rate_limit_error event mid-stream): what the
                # cut response streamed is not the answer, which streams whole after it.
                await supersede_in_place(ctx, committed=COMMITTED_EVENTS)
            continue
        limits.model_answered(ctx)
        seq = await _commit_turn(ctx, turn)
        if seq is not None:
            known_stops[seq] = TurnEnding(turn.stop_reason, ending_fields(turn.message))
        if turn.stop_reason in CONTINUE_REASONS and seq is not None:
            continue
        text = history.final_text() + turn.text if _continues(history) else turn.text
        return _ending(turn.stop_reason, text, turn.message)


class ModelCallCap:
    """The run's `max_model_calls` (worker config, `runrow worker --max-model-calls`): a safety
    net for a loop that never answers (a model that calls tools without end). Counted from the
    step log, so a resumed attempt counts what earlier attempts made, and the run fails once,
    never released to pay again. Only the run's own model turns count: a fork's steps
    1..forked_at_seq are its source's, copied by fork_run (and by retry_run of a fork), and were
    counted as the fork's own, so a fork of a long run failed before its first request."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.cap = int(ctx.config.get("max_model_calls", DEFAULT_MAX_MODEL_CALLS))
        self.given: int | None = None  # forked_at_seq (0: not a fork), read once an attempt

    async def reached(self, history: History) -> Outcome | None:
        """The run's ending when it has made its cap of model turns, else None."""
        turns = [step for step in history.steps if step.kind == "model_turn"]
        if len(turns) < self.cap:
            return None  # copied steps only lower the count: nothing to ask the database
        if self.given is None:
            run_id = self.ctx.run.run_id
            request = await self.ctx.db(
                lambda conn: forks_api.get_run_request(conn, run_id), "get_run_request"
            )
            self.given = request.forked_at_seq or 0
        made = sum(1 for step in turns if step.seq > self.given)
        if made < self.cap:
            return None
        self.ctx.log.warning("run made %d model calls, the cap: failing it", made)
        text = _turn_text(history.last_model_turn)
        return Outcome(
            "failed",
            result={"text": text, "stop_reason": "max_model_calls"},
            error=f"max_model_calls: the run made {made} model calls, this worker's cap (runrow worker "
            "--max-model-calls), without the model ending its turn; it ends here rather than pay for more",
        )


def _turn_text(step: Step | None) -> str:
    if step is None or not isinstance(step.payload, list):
        return ""
    return "".join(b.get("text", "") for b in step.payload if isinstance(b, dict) and b.get("type") == "text")


def _continues(history: History) -> bool:
    """The request ended with an assistant message (a paused turn): the new one extends it."""
    return bool(history.messages) and history.messages[-1]["role"] == "assistant"


async def _commit_turn(ctx: RunContext, turn: ModelTurn) -> int | None:
    """append_step the turn and journal `model_turn` in one transaction. None: empty content
    (nothing to store; the Messages API refuses an empty assistant message). Through a
    transient database error the transaction is made again, unless its unanswered COMMIT had
    landed: the step at the seq it took is this attempt's (only this claim appends this
    attempt's steps), so it is not appended twice."""
    run = ctx.run
    await ctx.journal.flush()  # the deltas land before the event that closes them
    event: dict[str, Any] = {
        "type": "model_turn",
        "stop_reason": turn.stop_reason,
        "usage": turn.usage,
        "request_id": turn.request_id,
        "model": turn.message.get("model"),
        "step_seq": None,
    }
    # Which of the run's stop_sequences fired, a refusal's details: clients read them in the
    # event; a resumed attempt or a fork ending on this turn reads them from the step
    # (turn_endings.recorded_ending), which the journal's trim leaves.
    event.update(ending_fields(turn.message))
    if not turn.message.get("content"):
        await limits.settle_unstored(ctx, turn.usage)
        await ctx.journal.emit(event)
        return None
    if ctx.lost.is_set():
        raise RunLost(str(run.run_id))

    async def commit(conn: AsyncConnection[Any]) -> int:
        seq = await steps_api.append_step(
            conn,
            run.run_id,
            run.claim_token,
            "model_turn",
            turn.content_text,
            turn.request_id,
            usage=turn.usage,
            stop_reason=turn.stop_reason,
            **stored_fields(turn.message),
        )
        if seq is None:
            raise RunLost(str(run.run_id))
        if await api.append_events(conn, run.run_id, run.claim_token, [{**event, "step_seq": seq}]) is None:
            raise RunLost(str(run.run_id))
        return seq

    assert ctx.retry is not None
    return await ctx.retry.transaction(
        ctx.pool,
        commit,
        "model_turn commit",
        landed=lambda conn, seq: steps_api.step_landed(conn, run.run_id, run.attempt, seq, "model_turn"),
    )


def _ending(stop_reason: str | None, text: str, message: dict[str, Any]) -> Outcome:
    """`message`: the turn's model message, or what its model_turn event recorded of it."""
    result: dict[str, Any] = {"text": text, "stop_reason": stop_reason, **ending_fields(message)}
    if stop_reason in ("end_turn", "stop_sequence", "refusal"):
        return Outcome("completed", result=result)
    if stop_reason == "max_tokens":
        return Outcome(
            "failed",
            result=result,
            error="max_tokens: the answer was cut off at the run's max_tokens; enqueue with a larger "
            "metadata.max_tokens",
        )
    if stop_reason == "model_context_window_exceeded":
        return Outcome(
            "failed",
            result=result,
            error="model_context_window_exceeded: the conversation no longer fits the model's context "
            f"window; {TOO_LONG_REMEDY}",
        )
    if stop_reason is None:
        return Outcome(
            "failed",
            result=result,
            error="the last model turn has no recorded stop_reason: its response may be incomplete (a "
            "stream that ended before message_stop), so its tool calls were not run; `runrow retry` "
            "asks the model again from the person's message",
        )
    if stop_reason == "pause_turn":
        # Reached only for a paused turn without content: the API refuses an empty assistant
        # message, so nothing can be sent back for it to continue. Sending the same request
        # again might pay for the same pause without end, so the run ends here, saying why.
        return Outcome(
            "failed",
            result=result,
            error="pause_turn without content: there is nothing to send back for the model to continue",
        )
    return Outcome("failed", result=result, error=f"unexpected stop_reason {stop_reason!r}")


async def _cancelled(ctx: RunContext, partial: str | None) -> Outcome:
    if partial is None:
        run = ctx.run
        history = await ctx.db(
            lambda conn: load_history(conn, run.conversation_id, run.run_id), "history load"
        )
        partial = history.final_text()
    ctx.log.info("run cancelled (%d characters of text kept)", len(partial))
    return Outcome("cancelled", result={"text": partial, "stop_reason": "cancelled"})
