"""The agent loop's side of the fleet limits: ask the database before each model request, and
tell it about a 429 (SPEC "Fleet scheduling"; the rules live in acquire_model_call and
report_rate_limited).

- granted: send the request.
- rate_limited / blocked for a short wait (at most `rate_limit_max_wait`, default 10 s): wait
  here, keeping the lease (the heartbeat runs beside), then ask again. A longer wait: defer
  the run (defer_run: requeued with retry_in = the wait and its attempt given back), so no
  worker slot is held idle and no run fails for having waited.
- budget_exhausted: acquire_model_call has already ended the run (failed, error
  budget_exhausted: ..., result the text so far, journaled); nothing more is written here.
- a 429: report the key blocked for the API's retry-after (or a backoff when it gave none),
  then ask again as above. After `MAX_429_IN_ATTEMPT` of them in one attempt the run is
  released with backoff instead.

Worker config `fleet_limits: False` turns all of this off (every worker meets the API alone;
the benchmark's baseline).
"""

from __future__ import annotations

import json
from typing import Any

from pyworker.agent.model import TurnFailed
from pyworker.db import limits as limits_api
from pyworker.db.aio import wait_event
from pyworker.worker.backoff import retry_in
from pyworker.worker.handler import Outcome, RunContext
from pyworker.worker.journal import RunLost

DEFAULT_MAX_WAIT = 10.0
MAX_429_IN_ATTEMPT = 5
MAX_ESTIMATE = 100_000_000  # acquire_model_call's range


def enabled(ctx: RunContext) -> bool:
    return bool(ctx.config.get("fleet_limits", True))


def estimate_input_tokens(params: dict[str, Any]) -> int:
    """A rough count of the request's input tokens (about 4 characters a token); the step's
    real usage settles the bucket, so the estimate only needs to be the right size."""
    size = len(json.dumps({k: params.get(k) for k in ("system", "tools", "messages")}, ensure_ascii=False))
    return min(MAX_ESTIMATE, size // 4 + 1)


async def before_request(ctx: RunContext, params: dict[str, Any]) -> Outcome | None:
    """None: go. Else the Outcome the handler returns (released to wait, or ended in SQL)."""
    if not enabled(ctx):
        return None
    run = ctx.run
    estimate = estimate_input_tokens(params)
    max_wait = float(ctx.config.get("rate_limit_max_wait", DEFAULT_MAX_WAIT))
    while True:
        slot = await ctx.db(
            lambda conn: limits_api.acquire_model_call(conn, run.run_id, run.claim_token, estimate),
            "acquire_model_call",
        )
        if slot is None:
            raise RunLost(str(run.run_id))
        if slot.granted:
            return None
        if slot.reason == "budget_exhausted":
            ctx.log.warning("budget exhausted: the database ended the run; no further model request")
            return Outcome("ended")
        wait = max(0.001, slot.wait_seconds or 0.0)
        if wait > max_wait:
            ctx.log.info("model call %s for %.1fs: releasing the run until then", slot.reason, wait)
            error = f"{slot.reason}: waiting {wait:.1f}s for a model call"
            return Outcome("defer", error=error, retry_in=wait)  # no attempt spent on a wait
        ctx.log.info("model call %s: waiting %.2fs", slot.reason, wait)
        if not await wait_event(ctx.cancel, wait):
            continue
        return None  # a stop arrived while waiting: the loop ends the run cancelled


async def settle_unstored(ctx: RunContext, usage: dict[str, Any] | None) -> None:
    """Pay for a response that will not be stored as a step (cut, failed or stopped mid-stream;
    empty content): what the API billed counts toward the run's and tenant's spend and budgets
    as a stored turn's does (record_usage). It was billed and never counted, so a tenant could
    overrun its budget by one response per attempt without end (the money audit). Whatever
    `fleet_limits` says: this is accounting, as append_step's settling is."""
    if not usage:
        return  # no message_start: nothing was billed
    run = ctx.run
    await ctx.db(
        lambda conn: limits_api.record_usage(conn, run.run_id, run.claim_token, usage), "record_usage"
    )


async def after_failure(ctx: RunContext, failed: TurnFailed, rate_limited_so_far: int) -> Outcome | None:
    """None: a 429 was reported; ask again (before_request). Else the run's Outcome."""
    run = ctx.run
    if failed.status == 429 and enabled(ctx) and rate_limited_so_far < MAX_429_IN_ATTEMPT:
        block = failed.retry_after or retry_in(rate_limited_so_far + 1)
        await ctx.db(
            lambda conn: limits_api.report_rate_limited(conn, run.run_id, run.claim_token, block),
            "report_rate_limited",
        )
        ctx.log.info("429: rate-limit key blocked fleet-wide for %.2fs", block)
        return None
    if not failed.retryable:
        return Outcome("failed", error=str(failed))
    return Outcome("release", error=str(failed), retry_in=retry_in(run.attempt, failed.retry_after))
