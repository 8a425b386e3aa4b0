"""The agent loop's side of the fleet limits: ask the database before each model request, and
tell it about a 429 (SPEC "Fleet scheduling"; the rules live in acquire_model_call and
report_rate_limited).

- granted: send the request.
- rate_limited / blocked for a short wait (at most `rate_limit_max_wait`, default 10 s): wait
  here, keeping the lease (the heartbeat runs beside), then ask again. A longer wait: defer
  the run (defer_run: requeued with retry_in = the wait and its attempt given back), so no
  worker slot is held idle and no run fails for having waited.
- budget_reserved (the tenant's budget is held by its other calls in flight; a wait of 15 s):
  always deferred, whatever `rate_limit_max_wait` says: those calls settle when their responses
  end, so a worker would hold a slot polling for a model response's length.
- budget_exhausted: acquire_model_call has already ended the run (failed, error
  budget_exhausted: ..., result the text so far, journaled); nothing more is written here.
- a 429: report the key blocked for the API's retry-after (or a backoff when it gave none),
  then ask again as above. Past `MAX_429_IN_ATTEMPT` of them in one attempt the run is
  deferred for the block instead (its attempt given back: a 429 is never billed), at most
  `MAX_429_DEFERRALS` times a run (counted and capped by defer_run in the database); after
  that such a deferral releases it, spending an attempt. A 429 about input tokens per minute
  for a request whose uncached text alone is more than that limit (`never_fits`) fails the
  run once and blocks nothing. A `rate_limit_error` event mid-stream is a 429 too (model.py).

- a response whose rate-limit headers say the requests bucket is empty
  (`anthropic-ratelimit-requests-remaining: 0`, pyworker/agent/ratelimit_headers.py): the next
  request before one refills would be a 429, so the key is blocked fleet-wide until one is back
  (report_rate_limit_exhausted, for (reset − date) / limit, at most 60 s), read as the
  response's headers arrive, before its body streams: the other workers' next
  acquire_model_call waits, and none of them sends into the empty bucket. With the header's
  limit passed too, a key with no limit set in the database is paced after the block at the
  API's refill (one request per that wait), so the slots waiting on it do not all go at once.

- an API key or account error (401, 402, a 403 about the key, "credit balance is too low";
  model.is_key_error): not the run's fault. Reported (report_key_error: the key is blocked
  fleet-wide for a wait that starts at `key_error_first_block` seconds, default 5, and doubles
  while the key stays broken, up to `key_error_max_block`, default 300), and the run deferred
  for that wait with its attempt given back. Logged at ERROR once per change of the error, not
  once per run, and once more (WARNING) when the key answers again. Refused again after the
  key answered a request sent since the run's last key error, the refusal is the run's own
  request's (a 403 for a beta, a tool type or a file the organisation may not use reads like
  one about the key) while the key works: report_key_error ends the run failed, once, and
  blocks nothing; so it does when the run's probe is refused with nothing answered, the run
  alone on its key and refused for at least `key_error_max_block` and 600 s since its own first
  refusal (`key_error_give_up`, default 3600 s, when other runs of the key are refused too). Either
  only for the same 403 as the run's last refusal. Such a run leaves the key's probe to
  another run of the key waiting for it (acquire_model_call's `probe_elsewhere`: the run is
  deferred, its slot freed).

Worker config `fleet_limits: False` turns all of this off (every worker meets the API alone;
the benchmark's baseline).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from pyworker.agent import ratelimit_headers
from pyworker.agent.model import TurnFailed, may_be_own_request
from pyworker.agent.prompt_cache import cache_mode
from pyworker.agent.uncached_input import uncached_input_tokens
from pyworker.db import limits as limits_api
from pyworker.db.aio import wait_event
from pyworker.db.retry import Retry
from pyworker.worker import metrics
from pyworker.worker.backoff import retry_in
from pyworker.worker.handler import Outcome, RunContext
from pyworker.worker.journal import RunLost

DEFAULT_MAX_WAIT = 10.0
KEY_ERROR_FIRST_BLOCK = 5.0
KEY_ERROR_MAX_BLOCK = 300.0
KEY_ERROR_GIVE_UP = 3600.0
# defer_run's max_429_in_attempt (functions/defer_run.sql): a deferral of a claim that reported
# more is counted against MAX_429_DEFERRALS whatever its reason (tests/test_defer_run_429s_reported.py).
MAX_429_IN_ATTEMPT = 5
MAX_ESTIMATE = 100_000_000  # acquire_model_call's range
# The longest a cancelled run waits to pay for its cut response. A drain gives the runs it
# abandons max(5 s, lease) to hand back before it cancels them outright: the release must
# still fit after this. record_usage takes milliseconds; past this the database is away.
INTERRUPTED_SETTLE_SECONDS = 2.0

# Payments under way for cancelled runs: asyncio keeps only weak references to tasks, and a
# caller cancelled again stops waiting for its payment, which must not be collected half-way.
_settling: set[asyncio.Task[None]] = set()

# This process's view of the API key: the key error last logged (None: the key works, as far
# as this worker knows), and, with fleet limits off, how many in a row (the worker's own backoff).
_key_error: str | None = None
_key_errors_in_a_row = 0


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
        # budget_reserved waits on other calls settling, which may take a model response's
        # whole length: always handed back, or a worker with a long rate_limit_max_wait held a
        # slot polling the tenant's budget row. The run keeps its place as the tenant's waiter
        # (tenant_budget.waiter_run names the run, not the claim) while it is queued and asks
        # again within a minute. probe_elsewhere (migration 0101): this run, refused a 403 since
        # the key last answered, leaves the key's probe to another run of the key, which may
        # need this very slot (a concurrency limit of one): waiting in place, it held that run
        # out and was refused again without end.
        if wait > max_wait or slot.reason in ("budget_reserved", "probe_elsewhere"):
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


async def settle_interrupted(ctx: RunContext, usage: dict[str, Any] | None) -> None:
    """settle_unstored for a response cut because the run's own task is being cancelled (a
    drain abandons the run, its claim was lost), called while that CancelledError is handled,
    before it is raised on. While a drain's claim still holds the run, the payment lands; a
    lost claim is fenced out and nothing is written, as it should be.

    The payment is a task of its own, awaited through a shield and bounded: a second
    cancellation (the run lost meanwhile, the drain's last resort) stops the wait, not the
    payment half-way, and a database that is away does not hold the cancellation up for a
    lease (settle_unstored retries for that long). It never raises but a cancellation: the
    caller's CancelledError is what must go on."""
    if not usage or ctx.lost.is_set():
        return
    payment = asyncio.create_task(_settle_within(ctx, usage, INTERRUPTED_SETTLE_SECONDS))
    _settling.add(payment)
    payment.add_done_callback(_settling.discard)
    await asyncio.shield(payment)


async def _settle_within(ctx: RunContext, usage: dict[str, Any], seconds: float) -> None:
    try:
        async with asyncio.timeout(seconds):
            await settle_unstored(ctx, usage)
    except RunLost:
        pass  # the journal's flush was fenced out: the claim is gone, so is the payment
    except TimeoutError:
        ctx.log.warning("a cut response's usage was not recorded: no database answer in %.0fs", seconds)
    except Exception as exc:
        ctx.log.warning("a cut response's usage was not recorded: %s: %s", type(exc).__name__, exc)


async def after_headers(ctx: RunContext, headers: Mapping[str, str] | None) -> None:
    """A model response's headers: when they say the requests bucket is empty, block the key
    fleet-wide until one request is back. Called as the headers arrive, before the body is
    read; the block is written beside the stream, not before it: awaited there, it delayed the
    answer's first token by the write (up to a lease while the database was away), and its
    error failed an answer the API had already billed (the review). It never raises."""
    if not enabled(ctx):
        return
    found = ratelimit_headers.buckets(headers)
    empty = ratelimit_headers.exhausted(headers)
    metrics.model_rate_limits(
        ((b.name, b.remaining, b.limit) for b in found), None if empty is None else empty.bucket
    )
    if empty is None:
        return
    report = asyncio.create_task(_report_exhausted(ctx, empty))
    _reporting.add(report)  # a strong reference: the loop keeps only a weak one
    report.add_done_callback(_reporting.discard)


_reporting: set[asyncio.Task[None]] = set()
# A block that commits later than this is one the next requests have already met (as 429s):
# not worth holding a connection for a lease of retries.
EXHAUSTED_REPORT_SECONDS = 5.0


async def _report_exhausted(ctx: RunContext, empty: ratelimit_headers.Exhausted) -> None:
    """report_rate_limit_exhausted, best effort: it journals nothing, so no flush comes first;
    fenced out when the run has ended meanwhile (nothing written)."""
    run = ctx.run
    retry = ctx.retry if ctx.retry is not None else Retry(EXHAUSTED_REPORT_SECONDS, ctx.log)
    try:
        async with asyncio.timeout(EXHAUSTED_REPORT_SECONDS):
            await retry.call(
                ctx.pool,
                lambda conn: limits_api.report_rate_limit_exhausted(
                    conn, run.run_id, run.claim_token, empty.seconds, empty.limit
                ),
                "report_rate_limit_exhausted",
            )
    except Exception as exc:  # TimeoutError, DatabaseUnavailable, an older schema: the 429s say it
        metrics.model_rate_limit_report_failed()
        ctx.log.warning(
            "rate limit: the API says %s has 0 left, but the key could not be blocked (%s: %s); "
            "the fleet learns it from the next 429",
            empty.bucket,
            type(exc).__name__,
            exc,
        )
        return
    ctx.log.info(
        "rate limit: the API says %s has 0 left: key blocked fleet-wide for %.2fs (one request back)",
        empty.bucket,
        empty.seconds,
    )


def model_answered(ctx: RunContext) -> None:
    """The model API answered a request: if this worker last saw a key error, say it is over."""
    global _key_error, _key_errors_in_a_row
    if _key_error is not None:
        ctx.log.warning("model API key works again (the key or account error has cleared)")
        metrics.model_key_works()
    _key_error = None
    _key_errors_in_a_row = 0


async def _key_error_ending(ctx: RunContext, failed: TurnFailed) -> Outcome:
    """The key or the account is broken, not the run: block the key fleet-wide and defer the
    run (no attempt spent). Logged at ERROR when the error is new to this worker. Unless the
    database knows better: refused again after the key answered a request sent since this
    run's last key error, the refusal is the run's own request's, and report_key_error has
    ended the run failed (a 403 for a beta, a tool type, a file the organisation may not use
    reads like one about the key, and was retried for ever, blocking the key each time), or
    refused with the same 403 as its probe, alone on its key, refused for at least
    max(key_error_max_block, 600 s) since its first refusal, or key_error_give_up when other runs
    of the key are refused too (migrations 0099, 0101, 0110)."""
    global _key_error, _key_errors_in_a_row
    run = ctx.run
    what = f"HTTP {failed.status}: {failed.detail or failed}"
    first = float(ctx.config.get("key_error_first_block", KEY_ERROR_FIRST_BLOCK))
    most = max(first, float(ctx.config.get("key_error_max_block", KEY_ERROR_MAX_BLOCK)))
    # report_key_error refuses a give-up under max_block_seconds or 600 s (22023).
    give_up = max(most, 600.0, float(ctx.config.get("key_error_give_up", KEY_ERROR_GIVE_UP)))
    wait: float | None = None
    if enabled(ctx):
        wait = await ctx.db(
            lambda conn: limits_api.report_key_error(
                conn,
                run.run_id,
                run.claim_token,
                what,
                first,
                most,
                may_be_own_request(failed.status),
                give_up,
            ),
            "report_key_error",
        )
        if wait is None:  # ended by the database (its own request), or fenced out: nothing more to write
            ctx.log.warning(
                "model API refused this run's request again with the same 403 after the key "
                "answered another, or alone through the key's outage (%s): the run's own request, "
                "not the key; the database ended the run failed (or the claim was lost)",
                what,
            )
            return Outcome("ended", error=f"model API refused the request: {what}")
    metrics.model_key_error(failed.status)
    if what != _key_error:
        ctx.log.error(
            "model API key or account error, every run of the key waits until it is fixed "
            "(rotate the key, top up the credit; `runrow status` shows the block): %s",
            what,
        )
        _key_error = what
    _key_errors_in_a_row += 1
    if wait is None:  # fleet limits off
        wait = min(most, first * 2 ** min(_key_errors_in_a_row - 1, 30))
    ctx.log.info("key error: run deferred for %.2fs, its attempt given back", wait)
    return Outcome("defer", error=f"key_error: {failed}", retry_in=max(0.001, wait))


async def after_failure(
    ctx: RunContext, failed: TurnFailed, rate_limited_so_far: int, params: dict[str, Any]
) -> Outcome | None:
    """None: a 429 was reported; ask again (before_request). Else the run's Outcome."""
    run = ctx.run
    if failed.key_error:
        return await _key_error_ending(ctx, failed)
    if failed.status == 429:
        never = never_fits(failed, params, cache_mode(ctx.run.metadata))
        if never is not None:
            # Not the key's fault and no wait cures it: blocking the key for it stopped the
            # whole fleet once per 429, without end (the review: 24 blocks for one run).
            ctx.log.warning("429 for a request larger than the key's per-minute limit: failing the run")
            return Outcome("failed", error=never)
    if failed.status == 429 and enabled(ctx):
        # The API's retry-after; else the reset its rate-limit headers give; else a backoff.
        empty = ratelimit_headers.exhausted(failed.headers)
        block = failed.retry_after or (empty.seconds if empty else None) or retry_in(rate_limited_so_far + 1)
        await ctx.db(
            lambda conn: limits_api.report_rate_limited(conn, run.run_id, run.claim_token, block),
            "report_rate_limited",
        )
        ctx.log.info("429: rate-limit key blocked fleet-wide for %.2fs", block)
        if rate_limited_so_far < MAX_429_IN_ATTEMPT:
            return None
        return await _past_429_cap(ctx, failed, rate_limited_so_far + 1, block)
    # Another refusal (a 529, a 400) may say a bucket is empty too: the next request would be a 429.
    if failed.status != 429:
        await after_headers(ctx, failed.headers)
    if not failed.retryable:
        return Outcome("failed", error=str(failed))
    return Outcome("release", error=str(failed), retry_in=retry_in(run.attempt, failed.retry_after))


def never_fits(failed: TurnFailed, params: dict[str, Any], cache: str) -> str | None:
    """The run's error when a 429 refused a request that no wait lets through: its input alone
    is more than the organisation's input tokens per minute. Judged only when the 429's message
    is about that limit (ratelimit_headers.input_tokens_limit), and only on the input that limit
    must count (uncached_input_tokens: no base64 payloads, no prefix the prompt cache may
    serve). The API's wording ("Please reduce the prompt length ... or try again later") is the
    same for a bucket that is merely empty, so the request's own size decides. A request that
    sends back an earlier answer of the run (with caching on) is not judged at all: its history
    may be read from the cache. Every 429 not judged here is bounded by MAX_429_DEFERRALS."""
    limit = ratelimit_headers.input_tokens_limit(failed.headers, failed.detail or str(failed))
    if limit is None:
        return None
    if cache != "off" and any(m.get("role") == "assistant" for m in params.get("messages") or []):
        return None
    estimate = uncached_input_tokens(params)
    if estimate <= limit:
        return None
    return (
        f"rate_limit: the request's input (about {estimate} tokens) is more than the API key's "
        f"limit of {limit} input tokens per minute, so no wait lets it through ({failed}); raise the "
        "organisation's limit, or start a new conversation with less in it"
    )


# How many times a run is deferred for 429s past MAX_429_IN_ATTEMPT (its attempt given back)
# before the next such 429 spends an attempt (released, as any transient failure: max_attempts
# bounds it). Each deferral waits out the API's retry-after after 6 refusals, each of which
# blocked the key for the whole fleet; a per-minute bucket that is only contended refills within
# a minute, so a run refused 24 times across 4 claims and their waits is not going to be served
# by waiting longer, and every further 429 stops the fleet again. 3: a burst of several minutes'
# contention still costs no attempt; a limit that never clears costs 24 blocks, not unbounded.
# The database keeps the count and the cap (defer_run, agent_run.cap_429_deferrals: migration
# 0103), whatever worker defers the run; this is its value, for the logs and the tests
# (tests/test_agent_model_errors.py reads the database's "after N deferrals" against it).
MAX_429_DEFERRALS = 3
# The reason's prefix that makes defer_run count a deferral against the cap.
PAST_429_CAP = "429_cap"


async def _past_429_cap(ctx: RunContext, failed: TurnFailed, count: int, block: float) -> Outcome:
    """Enough 429s for one attempt: hand the slot back until the block ends. Deferred, not
    released, the first MAX_429_DEFERRALS times (a 429 is never billed, and a run on its one
    attempt, the default, must not fail for a wait); after that defer_run releases it instead,
    spending its attempt (its error then says after how many deferrals)."""
    ctx.log.info(
        "429 x%d in this attempt: run handed back for %.2fs (deferred, its attempt given back; once past "
        "%d such deferrals defer_run releases it instead, spending the attempt)",
        count,
        block,
        MAX_429_DEFERRALS,
    )
    error = f"{PAST_429_CAP}: {count} in one attempt: {failed}"
    return Outcome("defer", error=error, retry_in=max(0.001, block))
